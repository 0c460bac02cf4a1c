"""One EXTRACT phase: read recent episodes, extract items per pool, record them, curate, commit a version.

What: `extract_phase(store, run_id, episode_ids, extractor, curator, *, candidate=False, batch=1)
-> PhaseResult`. For each pool, the episodes are visited in an order drawn from the pool's seed
(`curator.pool_seed(pool)`), one at a time per pool (or `batch` at a time), each against the pool's
lessons as they stand after the previous ones were curated -- the accumulation of the OPCD/OEL papers.
All pools advance together, so one batched completion call serves every pool at each step. Every
extraction (empty ones included) is recorded with its provenance before it is curated, and the round
ends with one new lesson-set version: a candidate for the gate (`candidate=True`) or live. With
`contrastive=True` an episode is shown next to a partner of the opposite result (`distill.lessons.contrast`).

Why here and not in the loop: it is the lessons' own logic (pools, seeds, ordering, provenance); the
loop only decides when to call it and runs the gate's evaluation episodes.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from distill.lessons.contrast import pick_partners
from distill.lessons.curate import CurationResult, LessonCurator
from distill.lessons.extractor import (
    ExtractionOutcome,
    ExtractionRequest,
    LessonExtractor,
    RecordedExtraction,
    record_extraction,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from memory import EpisodeInfo, ExperienceStore


@dataclass
class PhaseResult:
    """What one EXTRACT phase did: every extraction (recorded) and the curation it led to."""

    outcomes: list[ExtractionOutcome] = field(default_factory=list)
    recorded: list[RecordedExtraction] = field(default_factory=list)
    curation: CurationResult | None = None

    @property
    def empty_extractions(self) -> int:
        return sum(o.empty for o in self.outcomes)

    @property
    def rejected_items(self) -> int:
        return sum(len(o.rejected) for o in self.outcomes)

    @property
    def contrastive_extractions(self) -> int:
        return sum(o.contrast is not None for o in self.outcomes)


def extract_phase(
    store: ExperienceStore,
    run_id: int | None,
    episode_ids: Sequence[int],
    extractor: LessonExtractor,
    curator: LessonCurator,
    *,
    candidate: bool = False,
    batch: int = 1,
    note: str = "",
    contrastive: bool = False,
    lookback: int = 200,
    usable: Callable[[EpisodeInfo], bool] | None = None,
) -> PhaseResult:
    """Extract from `episode_ids` into every pool and commit the curated pools as one version (`usable`: which
    of the run's other episodes may serve as contrastive partners; the runtime leaves held-out tasks out).

    With `contrastive`, each episode that has a partner of the opposite result in the same environment
    (`distill.lessons.contrast.pick_partners`, looking `lookback` episodes back) is extracted from with
    the won/lost pair side by side; the others with the single-trajectory prompt.
    """
    assert batch >= 1, f"batch must be at least 1, got {batch}"
    # An episode that never got a turn (its reset failed) has nothing to learn from.
    episodes = [e for e in (store.episode(i) for i in episode_ids) if e.steps]
    partners = pick_partners(store, run_id, episodes, lookback=lookback, usable=usable) if contrastive else {}
    curator.begin()
    orders = []
    for pool in range(curator.pools):
        order = list(episodes)
        random.Random(curator.pool_seed(pool)).shuffle(order)
        orders.append(order)
    result = PhaseResult()
    for start in range(0, len(episodes), batch):
        requests = [
            ExtractionRequest(episode, curator.working(pool), pool, partners.get(episode.id))
            for pool, order in enumerate(orders)
            for episode in order[start : start + batch]
        ]
        step = []
        for outcome in extractor.run(requests):
            recorded = record_extraction(store, outcome, run_id=run_id, count_tokens=curator.count_tokens)
            result.outcomes.append(outcome)
            result.recorded.append(recorded)
            step += recorded.proposals
        curator.apply(step)  # in order, as if one by one; batched only for the embedder
    phase_note = f"extracted from {len(episodes)} episode(s)" + (f"; {note}" if note else "")
    result.curation = curator.commit(candidate=candidate, note=phase_note)
    return result
