"""Deterministic, schema-valid model answers built from a snapshot (payload v1).

The stand-in plays the model: it parses the prompt protocol and builds the output
object of reference §5 for the job type, citing only ids found in the snapshot. The
same input always gives the same answer (choices are seeded from a hash of the
input). Text handling copes with Markdown (headings, list markers, emphasis) and
with CJK text; when most of the material is CJK, the generated prose is Chinese.

=====================  ==========================================================
module                 what it holds
=====================  ==========================================================
``prompt``             the prompt protocol; the answerer of each task
``snapshot``           the snapshot as answerers read it (``View``, ``Source``)
``text``               prose out of Markdown: sentences, headings, code, CJK
``lexicon``            stop words, function words, English phrase keys
``terms``              key terms and how informative a sentence is
``shapes``             sentence shapes: definitions, namings, causes
``picking``            which sentences are used; the answer's token budget
``analysis``           learning state, weak points, next actions
``quiz``               quiz questions and their distractors
``flashcards``         flashcards
``broken``             answers made wrong on purpose (scripted faults)
=====================  ==========================================================
"""

from model_standin.answers.analysis import (
    learning_state_analysis,
    next_action_planning,
    weak_point_analysis,
)
from model_standin.answers.broken import foreign_ids, schema_violation
from model_standin.answers.flashcards import flashcard_generation
from model_standin.answers.picking import OUTPUT_TOKEN_BUDGET, estimate_tokens
from model_standin.answers.prompt import (
    ANSWERERS,
    Prompt,
    PromptError,
    build_answer,
    content_text,
    find_task,
    parse_prompt,
    register_answerer,
)
from model_standin.answers.quiz import DIFFICULTIES, QUESTION_TYPES, distractors, quiz_generation
from model_standin.answers.snapshot import Source, View
from model_standin.answers.text import is_cjk, is_code_like, is_heading_like, split_sentences

__all__ = [
    "ANSWERERS",
    "DIFFICULTIES",
    "OUTPUT_TOKEN_BUDGET",
    "QUESTION_TYPES",
    "Prompt",
    "PromptError",
    "Source",
    "View",
    "build_answer",
    "content_text",
    "distractors",
    "estimate_tokens",
    "find_task",
    "flashcard_generation",
    "foreign_ids",
    "is_cjk",
    "is_code_like",
    "is_heading_like",
    "learning_state_analysis",
    "next_action_planning",
    "parse_prompt",
    "quiz_generation",
    "register_answerer",
    "schema_violation",
    "split_sentences",
    "weak_point_analysis",
]
