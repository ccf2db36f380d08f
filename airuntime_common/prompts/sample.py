"""The sample snapshot an uploaded prompt template is rendered against (reference §10.4).

It has the shape of a real snapshot payload v1 (reference §5): one material of
three blocks, two knowledge points (one with quiz attempts), reading of two
blocks and the statistics, with a little non-ASCII text, so a template that
renders here renders for a learner.
"""

from __future__ import annotations

from typing import Any


def sample_snapshot(job_type: str, params: dict[str, Any]) -> dict[str, Any]:
    """A snapshot payload v1 of ``job_type`` for the user ``sample-user``.

    Args:
        job_type: the job type the payload is for.
        params: the job's params (the type's defaults for an upload).

    Returns:
        Plain JSON data.
    """
    material = "mat_sample"
    blocks = [
        ("blk_sample_1", "Photosynthesis turns light energy into chemical energy in chloroplasts."),
        ("blk_sample_2", "Chlorophyll absorbs red and blue light and reflects green light."),
        ("blk_sample_3", "光合作用在叶绿体中进行，产物是葡萄糖和氧气。"),
    ]
    return {
        "jobType": job_type,
        "targetType": "material",
        "targetId": material,
        "userId": "sample-user",
        "params": params,
        "materials": [
            {
                "materialId": material,
                "title": "Photosynthesis",
                "blockCount": len(blocks),
                "readBlockCount": 2,
                "progress": 0.67,
            }
        ],
        "blocks": [
            {"blockId": b, "materialId": material, "ordinal": i, "text": text}
            for i, (b, text) in enumerate(blocks)
        ],
        "knowledgePoints": [
            {
                "knowledgePointId": "kp_sample_1",
                "name": "Light absorption",
                "materialId": material,
                "blockIds": ["blk_sample_2"],
                "attempts": 4,
                "correct": 1,
                "accuracy": 0.25,
                "lastAttemptAt": "2026-01-01T10:00:00.000Z",
            },
            {
                "knowledgePointId": "kp_sample_2",
                "name": "Where photosynthesis happens",
                "materialId": material,
                "blockIds": ["blk_sample_1", "blk_sample_3"],
                "attempts": 0,
                "correct": 0,
                "accuracy": None,
                "lastAttemptAt": None,
            },
        ],
        "reading": [
            {
                "blockId": block,
                "materialId": material,
                "dwellSeconds": seconds,
                "lastReadAt": f"2026-01-01T09:5{i}:00.000Z",
            }
            for i, (block, seconds) in enumerate((("blk_sample_1", 42.0), ("blk_sample_2", 8.5)))
        ],
        "stats": {"quizAttempts": 4, "quizCorrect": 1, "readingSeconds": 50.5},
    }
