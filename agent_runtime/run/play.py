"""PLAY written once: when the other phases are due, and the session every executor drives.

`Schedule` reads the run's counters (`agent_runtime.state.RunState`, the run row's `state`) and is the only place
that says when EXTRACT and CONSOLIDATE are due and when the run stops. `PlaySession` is one PLAY phase's bookkeeping:
it hands out draws (draws left open by an earlier session first, then new ones while no phase is due), tracks which
draws are in flight, and commits each finished episode together with the state that includes it, in one transaction.

An executor decides only *where* episodes are played: `LocalExecutor` here (an `EpisodeRunner` in this
process), `agent_runtime.run.ray_executor.RayExecutor` on Ray actors (with its fault handling). Both take draws
from `PlaySession.next_draw`, hand finished episodes to `PlaySession.commit` and give draws back with
`PlaySession.give_back` when they cannot play them; neither touches the state.

The state moves only after its commit: a failed write leaves the state as it was and puts the draw back at
the front of the open draws, so a resumed run replays it (nothing counted that is not stored).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Protocol

from agent_runtime.config import RunConfig
from agent_runtime.episode.build import build_prompt_builders, sampling_params
from agent_runtime.episode.runner import Draw, EpisodeContext, EpisodeRunner, TaskSampler
from agent_runtime.phases.consolidate import CycleReport, run_cycle
from agent_runtime.phases.extract import ExtractReport, run_extract
from agent_runtime.state import Run, RunState
from agent_runtime.state.cursor import CursorMove
from memory import EpisodeRecord, ExperienceStore

if TYPE_CHECKING:
    from agent_runtime.episode.runner import EnvSlotSpec
    from agent_runtime.llm.base import PolicyBackend


class RequestWatch:
    """The run requests of one kind still waiting (a re-consolidation after `lessons forget`), asked of the
    store at most every `every` seconds: the schedule asks before each new draw."""

    def __init__(self, store: ExperienceStore, run_id: int, kind: str, every: float = 2.0):
        self.store, self.run_id, self.kind, self.every = store, run_id, kind, every
        self._checked, self._ids = float("-inf"), ()

    def pending(self, *, fresh: bool = False) -> tuple[int, ...]:
        """The waiting requests' ids; `fresh` asks the store now (the phase that carries them out)."""
        now = time.monotonic()
        if fresh or now - self._checked >= self.every:
            self._ids = tuple(r.id for r in self.store.requests(self.run_id, kind=self.kind, pending=True))
            self._checked = now
        return self._ids

    def carried_out(self, ids: tuple[int, ...]) -> None:
        """`ids` are done (their phase committed): no longer waiting, even in an answer still cached."""
        self._ids = tuple(i for i in self._ids if i not in ids)

    def __call__(self) -> bool:
        return bool(self.pending())


class Schedule:
    """When a phase is due and when the run is over: the one copy of these rules."""

    def __init__(self, config: RunConfig, deadline: float | None = None, requested: Callable[[], bool] = lambda: False):
        self.config = config
        self.deadline = deadline  # time.monotonic() after which no new draw starts
        self.requested = requested  # a re-consolidation was asked for (`RequestWatch`)

    @classmethod
    def starting_now(cls, config: RunConfig, requested: Callable[[], bool] = lambda: False) -> Schedule:
        hours = config.runtime.hours
        return cls(config, time.monotonic() + hours * 3600 if hours else None, requested)

    def _phase_ended(self, episodes: int, last_at: int) -> bool:
        """A curriculum phase ended after `last_at` episodes (its EXTRACT and CONSOLIDATE are due then)."""
        curriculum = self.config.curriculum
        return curriculum is not None and curriculum.boundary(episodes) > last_at

    def extract_due(self, state: RunState, episodes: int | None = None) -> bool:
        settings = self.config.lessons
        episodes = state.episodes if episodes is None else episodes
        due = episodes >= state.last_extract_at + settings.extract_every
        return settings.enabled and (due or self._phase_ended(episodes, state.last_extract_at))

    def assess_due(self, state: RunState, episodes: int | None = None) -> bool:
        """A curriculum's assessment is due: the start's, or that of a phase whose episodes are all played."""
        curriculum = self.config.curriculum
        episodes = state.episodes if episodes is None else episodes
        return curriculum is not None and state.assessed < 1 + curriculum.finished(episodes)

    def consolidation_requested(self) -> bool:
        """A re-consolidation was asked for: CONSOLIDATE is due now, whatever the episode count or target."""
        return self.config.opcd.enabled and self.requested()

    def consolidate_due(self, state: RunState, episodes: int | None = None) -> bool:
        settings = self.config.opcd
        episodes = state.episodes if episodes is None else episodes
        due = episodes >= state.last_consolidate_at + settings.consolidate_every
        due = settings.enabled and (due or self._phase_ended(episodes, state.last_consolidate_at))
        return due or self.consolidation_requested()

    def past_deadline(self) -> bool:
        return self.deadline is not None and time.monotonic() > self.deadline

    def target_reached(self, state: RunState) -> bool:
        target = self.config.runtime.episodes
        return target is not None and state.episodes >= target and not state.open_draws

    def over(self, state: RunState) -> bool:
        """No more PLAY: the episode target is reached or the time is up."""
        return self.target_reached(state) or self.past_deadline()

    def may_draw(self, state: RunState, committed_or_running: int) -> bool:
        """Whether a new draw may start, counting the episodes still running as done."""
        target = self.config.runtime.episodes
        if target is not None and committed_or_running >= target:
            return False
        return not (
            self.extract_due(state, committed_or_running)
            or self.consolidate_due(state, committed_or_running)
            or self.assess_due(state, committed_or_running)
            or self.past_deadline()
        )

    def before_play(self) -> str | None:
        """The phase due before PLAY starts, even once the run is over (a requested re-consolidation); None:
        none is."""
        return "CONSOLIDATE" if self.consolidation_requested() else None

    def after_play(self, state: RunState) -> str | None:
        """The phase a finished PLAY leads to (None: none is due)."""
        if self.extract_due(state):
            return "EXTRACT"
        if self.consolidate_due(state):
            return "CONSOLIDATE"
        return None

    def after_extract(self, state: RunState) -> str:
        return "CONSOLIDATE" if self.consolidate_due(state) else "PLAY"


class PlaySession:
    """One PLAY phase: draws out, episodes in, each commit with the state that counts it."""

    def __init__(
        self,
        state: RunState,
        schedule: Schedule,
        sampler: TaskSampler,
        store: ExperienceStore,
        run_id: int,
        *,
        context_for: Callable[[Draw], EpisodeContext],
        should_stop: Callable[[], bool],
        on_commit: Callable[[RunState], None] | None = None,
        choose_lessons: Callable[[EpisodeContext, str, str, str], EpisodeContext] | None = None,
    ):
        self.state = state
        self.schedule = schedule
        self.sampler = sampler
        self.store = store
        self.run_id = run_id
        self.context_for = context_for
        self.choose_lessons = choose_lessons  # fits an episode's lessons to the budget once its game is reset
        self.should_stop = should_stop
        self._on_commit = on_commit or (lambda state: None)
        self._reopen = list(state.open_draws)  # draws to play first, in order
        self._in_flight: set[int] = set()

    def next_draw(self) -> Draw | None:
        """The next draw to play: an open one first, then a new one while the schedule allows it."""
        if self._reopen:
            index = self._reopen.pop(0)
        elif self.schedule.may_draw(self.state, self.state.episodes + len(self._in_flight)):
            index = self.state.next_draw
            self.state.next_draw += 1
        else:
            return None
        self._in_flight.add(index)
        return self.sampler.draw(index)

    def give_back(self, indices: list[int]) -> None:
        """Draws an executor could not finish (a worker died): they are handed out again before new ones."""
        self._in_flight.difference_update(indices)
        self._reopen[:0] = sorted(indices)

    def in_flight(self) -> list[int]:
        return sorted(self._in_flight)

    def open_draws(self) -> list[int]:
        return sorted(self._in_flight | set(self._reopen))

    def commit(self, record: EpisodeRecord) -> None:
        """Store a finished episode with the state that counts it; the state moves only if the write succeeds."""
        index = record.metadata["draw"]
        assert index in self._in_flight, f"draw {index} was not handed out by this session"
        after = self.state.with_episode(record, sorted((self._in_flight - {index}) | set(self._reopen)))
        try:
            self.store.add_episode(self.run_id, record, run_state=after.stored())
        except BaseException:
            self.give_back([index])  # replayed on resume (or by this session, if the caller goes on)
            raise
        self._in_flight.discard(index)
        self.state = after
        self._on_commit(after)

    def save(self) -> None:
        """Persist the state with every draw not committed as open (the end of the phase, or a stop)."""
        self.state.open_draws = self.open_draws()
        self.store.update_run(self.run_id, state=self.state.stored())


class Executor(Protocol):
    """Where the loop's phases run. PLAY drives a `PlaySession`; EXTRACT and CONSOLIDATE return their reports."""

    label: str  # shown on the PLAY progress bar

    def play(self, session: PlaySession, adapter) -> None: ...

    def extract(self, episode_ids: list[int], finish: CursorMove) -> ExtractReport: ...

    def consolidate(
        self,
        finish: CursorMove,
        progress: Callable[[dict], None] | None = None,
        on_poll: Callable[[], None] | None = None,
    ) -> CycleReport: ...

    def close(self) -> None: ...


def phase_plays(config: RunConfig) -> Callable[[int], set[int]] | None:
    """A draw's index -> the environments its curriculum phase plays (positions in `config.envs`); None without a
    curriculum. A runner closes the other environments' instances (`EpisodeRunner`'s `plays`)."""
    if config.curriculum is None:
        return None
    return partial(config.curriculum.plays, [entry.id for entry in config.envs])


class LocalExecutor:
    """Every phase in this process, with the driver's own backend (built on first use)."""

    label = "PLAY"

    def __init__(self, run: Run, envs: list[EnvSlotSpec], backend: Callable[[], PolicyBackend], examples_for=None):
        self.run, self.envs = run, envs
        self._backend = backend
        self.examples_for = examples_for

    def play(self, session: PlaySession, adapter) -> None:
        backend = self._backend()
        runner = EpisodeRunner(
            backend,
            self.envs,
            build_prompt_builders(self.run.config, self.envs, backend),
            sampling_params(self.run.config.model),
            slots=self.run.config.runtime.slots,
            policy_name=self.run.config.model.name,
            context_for=session.context_for,
            choose_lessons=session.choose_lessons,
            adapter_id=adapter.id if adapter else None,
            examples_for=self.examples_for,
            explore=self.run.config.agent.explore,
            seed=self.run.config.seed,
            plays=phase_plays(self.run.config),
        )
        try:
            runner.run(session.next_draw, session.commit, session.should_stop)
        finally:
            runner.close()

    def extract(self, episode_ids: list[int], finish: CursorMove) -> ExtractReport:
        return run_extract(self.run, self._backend(), episode_ids, finish=finish)

    def consolidate(self, finish: CursorMove, progress=None, on_poll=None) -> CycleReport:
        return run_cycle(self.run, self._backend(), progress=progress, finish=finish)

    def close(self) -> None:
        """Nothing of its own to release: the backend belongs to the loop."""
