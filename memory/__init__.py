"""The experience memory: everything the agent played, learned and trained, in SQL (+ FAISS).

Open it with `ExperienceStore.open(workdir_or_url)`; write episodes as `EpisodeRecord`s; read back
dataclasses from `memory.records`. The errors it raises on purpose derive from `MemoryStoreError`.
The named values of state columns (a lesson set's status and maker, an evaluation's kind) are exported
here, so that no caller spells them. Test doubles (record builders, a demo store) are `memory.testing`.
This package imports nothing else of ours (see docs/architecture.md: agent_runtime -> distill -> memory).
"""

from memory.errors import (
    DatabaseOutdatedError,
    DatabaseTooNewError,
    ImportConflictError,
    ImportFormatError,
    InvalidRecordError,
    MemoryStoreError,
    NotADatabaseError,
    NotFoundError,
    ReadOnlyStoreError,
    StoreUnavailableError,
)
from memory.evaluation_store import MeasuredUtility
from memory.models import (
    EVALUATION_EVAL,
    EVALUATION_GATE,
    EVALUATION_KINDS,
    EVALUATION_LESSON_UTILITY,
    LESSON_SET_CANDIDATE,
    LESSON_SET_LIVE,
    LESSON_SET_MAKERS,
    LESSON_SET_STATUSES,
    LESSON_SOURCE_USER,
    MADE_BY_AGENT,
    MADE_BY_USER,
)
from memory.records import (
    AdapterInfo,
    CycleInfo,
    EpisodeInfo,
    EpisodeRecord,
    EvaluationInfo,
    ExtractionInfo,
    LessonInfo,
    LessonSetInfo,
    RequestInfo,
    RunInfo,
    SearchHit,
    StepInfo,
    StepRecord,
)
from memory.store import ExperienceStore

__all__ = [
    "EVALUATION_EVAL",
    "EVALUATION_GATE",
    "EVALUATION_KINDS",
    "EVALUATION_LESSON_UTILITY",
    "LESSON_SET_CANDIDATE",
    "LESSON_SET_LIVE",
    "LESSON_SET_MAKERS",
    "LESSON_SET_STATUSES",
    "LESSON_SOURCE_USER",
    "MADE_BY_AGENT",
    "MADE_BY_USER",
    "AdapterInfo",
    "CycleInfo",
    "DatabaseOutdatedError",
    "DatabaseTooNewError",
    "EpisodeInfo",
    "EpisodeRecord",
    "EvaluationInfo",
    "ExperienceStore",
    "ExtractionInfo",
    "ImportConflictError",
    "ImportFormatError",
    "InvalidRecordError",
    "LessonInfo",
    "LessonSetInfo",
    "MeasuredUtility",
    "MemoryStoreError",
    "NotADatabaseError",
    "NotFoundError",
    "ReadOnlyStoreError",
    "RequestInfo",
    "RunInfo",
    "SearchHit",
    "StepInfo",
    "StepRecord",
    "StoreUnavailableError",
]
