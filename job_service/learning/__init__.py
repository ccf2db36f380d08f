"""The learner's data and what jobs make of it (reference §3.1, §5).

Materials split into blocks (:mod:`.materials`), knowledge points
(:mod:`.knowledge_points`), learning events and their running totals
(:mod:`.events`), the snapshot a job is given (:mod:`.snapshots`,
:mod:`.payload`), generation plans (:mod:`.plans`) and the business rows of
accepted results (:mod:`.results`). Every function runs in the caller's
transaction; :mod:`.port` is the seam the job core calls.
"""

from job_service.learning.deletion import (
    MaterialScope,
    delete_knowledge_point,
    delete_material,
    delete_result_item,
    erase_user,
    material_scope,
)
from job_service.learning.events import MAX_EVENT_BATCH, LearningEventIn, record_learning_events
from job_service.learning.knowledge_points import (
    KnowledgePointView,
    create_knowledge_point,
    get_knowledge_point,
    list_knowledge_points,
)
from job_service.learning.materials import (
    BlockView,
    MaterialView,
    create_material,
    get_material,
    list_materials,
)

__all__ = [
    "MAX_EVENT_BATCH",
    "BlockView",
    "KnowledgePointView",
    "LearningEventIn",
    "MaterialScope",
    "MaterialView",
    "create_knowledge_point",
    "create_material",
    "delete_knowledge_point",
    "delete_material",
    "delete_result_item",
    "erase_user",
    "get_knowledge_point",
    "get_material",
    "list_knowledge_points",
    "list_materials",
    "material_scope",
    "record_learning_events",
]
