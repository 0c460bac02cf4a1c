"""The run's cursor move: what a phase writes about the run, in the transaction of its own results.

A phase (EXTRACT, an OPCD cycle) is given a `CursorMove` by whoever runs it and applies it itself, inside the
transaction that commits what it produced, so a process killed anywhere either has both or neither: a resumed
run never repeats a finished phase and never skips an unfinished one. This module is the low-level token only;
it imports nothing of the loop or of any phase.
"""

from __future__ import annotations

from dataclasses import dataclass

from memory import ExperienceStore


@dataclass(frozen=True)
class CursorMove:
    """The run's cursor and state once a phase is done, and the run requests the phase carried out.

    `phase` None moves nothing (`agent-runtime distill` outside the loop: only the requests are marked done).
    `state_if_skipped` is the state to write when the phase found nothing to do (an OPCD cycle with no live
    lessons counts no cycle); None writes `state` in that case too."""

    phase: str | None
    state: dict | None = None
    requests_done: tuple[int, ...] = ()
    state_if_skipped: dict | None = None

    def apply(self, store: ExperienceStore, run_id: int, *, skipped: bool = False) -> None:
        """Write the move; call it inside the transaction of the phase's results (`ExperienceStore.transaction`)."""
        if self.phase is not None:
            state = self.state_if_skipped if skipped and self.state_if_skipped is not None else self.state
            store.update_run(run_id, phase=self.phase, state=state)
        for request_id in self.requests_done:
            store.finish_request(request_id, {"done_by": self.phase or "distill"})
