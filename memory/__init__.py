"""The experience memory: everything the agent played, learned and trained, in SQL (+ FAISS).

Open it with `ExperienceStore.open(workdir_or_url)`; write episodes as `EpisodeRecord`s; read back
dataclasses from `memory.records`. The errors it raises on purpose derive from `MemoryStoreError`.
This package imports nothing else of ours (see docs/DESIGN: agent_runtime -> distill -> memory).
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
from memory.records import (
    AdapterInfo,
    CycleInfo,
    EpisodeInfo,
    EpisodeRecord,
    EvaluationInfo,
    ExtractionInfo,
    LessonInfo,
    LessonSetInfo,
    RunInfo,
    SearchHit,
    StepInfo,
    StepRecord,
)
from memory.store import ExperienceStore

__all__ = [
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
    "MemoryStoreError",
    "NotADatabaseError",
    "NotFoundError",
    "ReadOnlyStoreError",
    "RunInfo",
    "SearchHit",
    "StepInfo",
    "StepRecord",
    "StoreUnavailableError",
]
