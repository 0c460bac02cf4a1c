"""Contrasting partners for ExpeL-style extraction: for each episode, one of the opposite result.

What: `pick_partners(store, run_id, episodes, *, lookback=200) -> dict[episode id, EpisodeInfo]` gives
each episode of an EXTRACT phase a partner that was won where it was not (or not won where it was), in
the same environment, loaded with its steps. Episodes without a partner are simply absent from the
result, and the phase extracts from them with the single-trajectory prompt (the fallback).

How a partner is chosen, best first:
1. the same task id (the cleanest contrast: same goal, different play), then the same environment;
2. within each, an episode the phase read, then an older episode of the run (the newest `lookback`
   episodes of that environment; 0 looks at the episodes read only);
3. then the nearest in time (closest episode id), so the choice is deterministic.
Episodes that ended in an error, or never got a turn, neither get nor serve as a partner: they say
nothing about play.

Why look back: an EXTRACT phase reads few episodes (8 by default), and a small model often wins none or
all of them; the run's history usually holds the missing half of a pair.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from memory import EpisodeInfo, ExperienceStore


def _playable(episode: EpisodeInfo) -> bool:
    return episode.outcome != "error" and episode.num_steps > 0


def pick_partners(
    store: ExperienceStore,
    run_id: int | None,
    episodes: Sequence[EpisodeInfo],
    *,
    lookback: int = 200,
    usable: Callable[[EpisodeInfo], bool] | None = None,
) -> dict[int, EpisodeInfo]:
    """A contrasting partner (with its steps) for every episode that has one (see module doc); `usable`
    says which episodes may be learned from at all (the runtime leaves held-out evaluation tasks out), checked
    on the partner with its steps."""
    assert lookback >= 0, f"lookback must be non-negative, got {lookback}"
    read = {e.id: e for e in episodes}
    history: dict[str, list[EpisodeInfo]] = {}
    partners: dict[int, EpisodeInfo] = {}
    for episode in episodes:
        if not _playable(episode):
            continue
        if episode.env_id not in history:
            older = store.episodes(run_id, env_id=episode.env_id, limit=lookback) if lookback and run_id else []
            history[episode.env_id] = [e for e in older if e.id not in read]
        pool = [e for e in episodes if e.env_id == episode.env_id] + history[episode.env_id]
        candidates = [e for e in pool if e.id != episode.id and _playable(e) and e.won != episode.won]
        if not candidates:
            continue
        ranked = sorted(
            candidates,
            key=lambda e: (e.task_id != episode.task_id, e.id not in read, abs(e.id - episode.id), e.id),
        )
        for candidate in ranked:
            full = candidate if candidate.id in read else store.episode(candidate.id)
            if usable is None or usable(full):
                partners[episode.id] = full
                break
    return partners
