"""Lessons: experience items extracted from trajectories, curated under a token budget, versioned, gated.

The pieces (each module's docstring has the details):
- `distill.lessons.extractor`: the extraction prompt (single or contrastive), `parse_items`, `LessonExtractor`,
  `record_extraction`; `distill.lessons.render` shows episodes and lessons to it.
- `distill.lessons.contrast`: `pick_partners`, a won/lost partner per episode for the contrastive prompt.
- `distill.lessons.safety`: cleaning and rejecting items (control tokens, injections, secrets, length).
- `distill.lessons.curate`: `LessonCurator` (add / merge / update / delete, budget, pools), `render_lessons`,
  `restates` (a text that says nothing a lesson does not).
- `distill.lessons.versions`: live and candidate versions, promote, reject, restore, diff.
- `distill.lessons.gate`: `decide_gate` (promote or block, with its numbers) and per-lesson utility.
- `distill.lessons.golive`: `gate_candidate`, where a candidate set's new lessons go live (per environment, alone and
  together); `distill.lessons.selection`: `induce_and_select`, which induced lessons go live. Both are given the
  games' outcomes as a function; the runtime plays them.
- `distill.lessons.extract_phase`: `extract_phase`, one EXTRACT phase end to end.
- `distill.lessons.user_lessons`: lessons a person writes (`add_user_lessons`, `retire_lessons`), same doors.
- `distill.lessons.stats`: `extraction_stats`, how many extracted items pass the screen and go live.
- `distill.lessons.config`: `LessonsConfig`, every knob.

Storage is the experience memory (`memory.ExperienceStore`); this package never imports agent_runtime.
"""

from distill.lessons.config import LessonsConfig
from distill.lessons.contrast import pick_partners
from distill.lessons.curate import Change, CurationResult, LessonCurator, render_lessons, restates
from distill.lessons.errors import GateInputError, LessonsError, UnknownLessonError, UnknownVersionError
from distill.lessons.extract_phase import PhaseResult, extract_phase
from distill.lessons.extractor import (
    ExtractionOutcome,
    ExtractionRequest,
    LessonExtractor,
    Proposal,
    RecordedExtraction,
    build_prompt,
    parse_free_text,
    parse_items,
    parse_operation,
    record_extraction,
)
from distill.lessons.gate import (
    GateDecision,
    LessonUtility,
    decide_gate,
    lesson_utilities,
    load_utilities,
    measure_utilities,
    store_gate_decision,
    store_utilities,
)
from distill.lessons.induce import Finding, induce
from distill.lessons.safety import Rejection, mask_credentials, screen_item, screen_items, strip_control
from distill.lessons.stats import ExtractionStats, extraction_stats
from distill.lessons.user_lessons import (
    RetireResult,
    UserAddResult,
    UserItem,
    add_user_lessons,
    pending_user_candidate,
    retire_lessons,
)
from distill.lessons.versions import (
    LessonSetDiff,
    diff_versions,
    is_user_version,
    lesson_provenance,
    live_lessons,
    live_version,
    pending_candidate,
    promote_candidate,
    reject_candidate,
    restore_version,
    sync_statuses,
)

__all__ = [
    "Change",
    "CurationResult",
    "ExtractionOutcome",
    "ExtractionRequest",
    "ExtractionStats",
    "Finding",
    "GateDecision",
    "GateInputError",
    "LessonCurator",
    "LessonExtractor",
    "LessonSetDiff",
    "LessonUtility",
    "LessonsConfig",
    "LessonsError",
    "PhaseResult",
    "Proposal",
    "RecordedExtraction",
    "Rejection",
    "RetireResult",
    "UnknownLessonError",
    "UnknownVersionError",
    "UserAddResult",
    "UserItem",
    "add_user_lessons",
    "build_prompt",
    "decide_gate",
    "diff_versions",
    "extract_phase",
    "extraction_stats",
    "induce",
    "is_user_version",
    "lesson_provenance",
    "lesson_utilities",
    "live_lessons",
    "live_version",
    "load_utilities",
    "mask_credentials",
    "measure_utilities",
    "parse_free_text",
    "parse_items",
    "parse_operation",
    "pending_candidate",
    "pending_user_candidate",
    "pick_partners",
    "promote_candidate",
    "record_extraction",
    "reject_candidate",
    "render_lessons",
    "restates",
    "restore_version",
    "retire_lessons",
    "screen_item",
    "screen_items",
    "store_gate_decision",
    "store_utilities",
    "strip_control",
    "sync_statuses",
]
