"""The long-lived loop: a persisted state machine, one row per run in the experience store.

    PLAY -> EXTRACT (every N episodes) -> CONSOLIDATE (every M episodes) -> EVALUATE -> PROMOTE | ROLLBACK -> PLAY

(CONSOLIDATE straight from PLAY when only it is due, and at once when `lessons forget` asked for a
re-consolidation, even at the episode target: docs/architecture.md draws the whole machine.)

The run row's `phase` is the cursor (EVALUATE and PROMOTE | ROLLBACK run inside CONSOLIDATE, whose cycle
row is their cursor) and its `state` the counters (`agent_runtime.state.RunState`). During PLAY every
finished episode is written together with the run's new state (episodes done, the next draw index, the draws
still in flight), so `kill -9` at any moment followed by `run --resume` loses at most the episodes that were
in flight and re-plays exactly those draws: nothing is lost or duplicated. A phase that is due stops new
draws; the slots drain, the cursor moves, and the phase runs. EXTRACT and CONSOLIDATE write their results
and the cursor's move in one transaction (`CursorMove`): a run killed inside EXTRACT has none of it and runs
it again over the same episodes; one killed after a phase never runs it twice.

Where the phases run is the executor's business (`agent_runtime.run.play.LocalExecutor`, or
`agent_runtime.run.ray_executor.RayExecutor`); when they are due is the `Schedule`'s; this module holds the
state machine, signals, progress and the summary.

SIGINT or SIGTERM asks the loop to stop: the current turn finishes, its episodes are committed, and the
process exits 0. The run can then be resumed. A loop started without `resume` where the store holds a run of the
config's name continues it when it has not played and is refused otherwise (`agent_runtime.run.names`).
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from tqdm.auto import tqdm

from agent_runtime.checkpoints import resolve_model
from agent_runtime.config import (
    ConfigError,
    RunConfig,
    open_owned,
    save_resolved,
    stored_config,
)
from agent_runtime.episode.build import build_envs
from agent_runtime.episode.examples import example_retriever
from agent_runtime.episode.runner import TaskSampler
from agent_runtime.evaluation.heldout import check_folds
from agent_runtime.evaluation.matrix import assess
from agent_runtime.evaluation.rounds import RoundClock, round_fields, round_line
from agent_runtime.llm import LOCAL_WEIGHTS, PolicyBackend, check_capabilities, make_backend
from agent_runtime.llm.base import BackendStats, activate
from agent_runtime.phases.consolidate import roll_back_interrupted
from agent_runtime.phases.extract import add_seed_lessons, gate_user_lessons, learnable_recent
from agent_runtime.phases.lesson_contexts import LessonContexts
from agent_runtime.phases.probe import check_backend, stored_reference, tolerance_for
from agent_runtime.phases.promotion import decision_sights
from agent_runtime.run.names import continues_existing
from agent_runtime.run.play import Executor, LocalExecutor, PlaySession, RequestWatch, Schedule
from agent_runtime.state import Run, RunState
from agent_runtime.state.cursor import CursorMove
from agent_runtime.state.profile import Profile, memory_mb
from agent_runtime.terminal import shown
from distill.lessons import pending_user_candidate, sync_statuses
from distill.lessons.forget import RECONSOLIDATE
from memory import AdapterInfo, ExperienceStore
from modelkit.weights import bound_heap, release_memory

log = logging.getLogger("agent_runtime.run.loop")

# The cursor's values. EVALUATE, PROMOTE and ROLLBACK run inside CONSOLIDATE (`run_cycle`), whose cycle row is
# their cursor: the run's own cursor never stops on them.
PHASES = ("PLAY", "EXTRACT", "CONSOLIDATE")


class PhaseNotAvailableError(ConfigError):
    """The config enables a phase this version cannot run yet."""


@dataclass
class RunSummary:
    run_id: int
    episodes: int
    won: int
    errors: int
    new_episodes: int
    seconds: float
    completion_tokens: int
    tokens_per_s: float
    stopped_by_signal: bool
    extractions: int = 0
    lesson_set_version: int | None = None
    cycles: int = 0
    adapter: str | None = None

    @property
    def success_rate(self) -> float:
        return self.won / self.episodes if self.episodes else 0.0

    def line(self) -> str:
        lessons = f", lesson set v{self.lesson_set_version}" if self.lesson_set_version is not None else ""
        if self.cycles:
            lessons += f", {self.cycles} OPCD cycles, adapter {self.adapter or 'none (base model)'}"
        return (
            f"run {self.run_id}: {self.episodes} episodes ({self.new_episodes} this session), "
            f"success {self.success_rate:.1%}, errors {self.errors}{lessons}, "
            f"{self.tokens_per_s:.1f} generated tokens/s, {self.seconds:.1f}s"
        )


def default_workdir(config_name: str) -> Path:
    return Path("runs") / config_name


def check_phases(config: RunConfig) -> None:
    """The phases the config enables can run (what they need of the backend is checked when it is built:
    `agent_runtime.llm.check_capabilities`)."""
    if config.opcd.enabled and config.model.backend not in LOCAL_WEIGHTS:
        raise PhaseNotAvailableError(
            f"opcd.enabled: consolidation trains the policy's own weights (model.name), which needs backend: "
            f"{' or '.join(LOCAL_WEIGHTS)} (got {config.model.backend}); set opcd.enabled: false or use one of them"
        )
    if config.opcd.enabled and not config.lessons.enabled and config.opcd.context is None:
        raise PhaseNotAvailableError(
            "opcd.enabled: consolidation distils the lessons, so lessons.enabled must be "
            "true (or give opcd.context: a system prompt to distil instead)"
        )
    processes, on_driver = config.opcd.trainer.processes, config.runtime.executor == "local"
    if config.opcd.enabled and processes > 1 and on_driver and config.model.device.startswith("cuda"):
        gpus = torch.cuda.device_count()
        if processes > gpus:
            raise PhaseNotAvailableError(
                f"opcd.trainer.processes: {processes} data-parallel ranks on CUDA need one "
                f"GPU each, but {gpus} are visible; lower processes to {gpus} or fewer"
            )


class _OwnedFileHandler(logging.FileHandler):
    """A log file the runtime owns: appended to, never through a symbolic link (`open_owned`)."""

    def _open(self):
        return open_owned(Path(self.baseFilename), "a", encoding=self.encoding or "utf-8")


def _json_log(workdir: Path) -> logging.Handler:
    handler = _OwnedFileHandler(workdir / "run.log.jsonl", encoding="utf-8")

    class _Fmt(logging.Formatter):
        def format(self, record: logging.LogRecord) -> str:
            payload = {"time": self.formatTime(record), "level": record.levelname, "msg": record.getMessage()}
            payload.update(getattr(record, "fields", {}))
            return json.dumps(payload, default=str)

    handler.setFormatter(_Fmt())
    return handler


def _resumed_run(store: ExperienceStore, run_id: int, name: str):
    """The run `config.resume.stored_config` chose, in the store the loop opened: the same run, or a clear error."""
    run = next((r for r in store.runs() if r.id == run_id), None)
    if run is None or run.name != name:
        found = f"run {run_id} there is named {run.name!r}" if run is not None else f"it has no run {run_id}"
        raise ConfigError(
            f"--resume: the run to continue is run {run_id} ({name!r}), but the store "
            f"this run opens ({store.url}) is another one: {found}. Give the config the "
            "stored run's memory.url, or start a new run without --resume"
        )
    return run


def _on_learner(config: RunConfig) -> bool:
    """EXTRACT and CONSOLIDATE run on the Ray learner rather than in this process."""
    return config.runtime.executor == "ray" and config.runtime.ray.learner == "worker"


class AgentLoop:
    def __init__(
        self,
        config: RunConfig,
        workdir: Path,
        *,
        resume: bool = False,
        backend: PolicyBackend | None = None,
        progress: bool = True,
    ):
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        bound_heap()  # a long-lived process: freed tensors go back to the system (modelkit.weights)
        resumed_id = None
        resume = resume or continues_existing(config, workdir)  # one run per name in a store (`run.names`)
        if resume:
            config, resumed_id = stored_config(config, workdir)
        check_phases(config)
        self.profile = Profile(
            lambda: getattr(self, "stats", None), lambda: getattr(getattr(self, "_backend", None), "prefix_stats", None)
        )
        with self.profile.phase("START"):
            self.envs, tasks = build_envs(config, workdir)
            sights = [line for line, blind in decision_sights(config) if blind]
            for line in check_folds(config, workdir) + sights:  # a fold that overlaps another raises here
                log.warning(line)
                print(shown(f"warning: {line}"), file=sys.stderr)
        weights, ids, curriculum = [e.weight for e in config.envs], [e.id for e in config.envs], config.curriculum
        by_phase = (lambda index: curriculum.weights(ids, weights, index)) if curriculum is not None else None
        self.sampler = TaskSampler(weights, tasks, config.seed, weights_for=by_phase)
        # Under Ray with the learner on a worker the driver never generates: it does not load the model at all
        # (a driver on a CPU node next to the database); its executor counts the workers' tokens.
        self._backend = backend
        if backend is not None:
            check_capabilities(backend, config, [e.family for e in self.envs])  # held to what a built one would be
        elif not _on_learner(config):
            with self.profile.phase("START: model"):
                self._backend = self._make_backend(config)
        elif config.model.backend in LOCAL_WEIGHTS:
            resolve_model(config.model.name)  # an unknown model fails here, not on every worker
        # Generation counters of the acting policy: the driver's backend, or the Ray workers' summed up.
        self.stats = BackendStats() if config.runtime.executor == "ray" else self._backend.stats
        torch.manual_seed(config.seed)
        store = ExperienceStore.open(config.memory.url or workdir, embedder=config.memory.embedder)
        save_resolved(config, workdir)
        if resume:
            run = _resumed_run(store, resumed_id, config.name)
            run_id, self.state, self.phase = run.id, RunState.from_stored(run.state), run.phase or "PLAY"
            sync_statuses(store, run_id)
        else:
            run_id = store.create_run(config.name, config.model_dump(mode="json"))
            self.state, self.phase = RunState(), "PLAY"
            add_seed_lessons(config, store, run_id, self._backend)
        # the run as the phases are given it: the loop's config, workdir, store and run id are read from it
        self.the_run = Run(config, workdir, store, run_id)
        self.lessons = LessonContexts.for_run(self.the_run, [(e.env_id, e.family) for e in self.envs])
        self.adapter: AdapterInfo | None = None
        self._act_with_run_adapter()
        self.progress = progress
        self.requests = RequestWatch(self.store, self.run_id, RECONSOLIDATE)  # `lessons forget` asks for a cycle
        self.schedule = Schedule(config, requested=self.requests)
        self.stop_requested = False
        self._clock = RoundClock()
        self._executor: Executor | None = None  # built on first use (a resumed run may start in any phase)
        self._probed: int | None = None  # the adapter the loop's own backend last passed the probe with

    def _act_with_run_adapter(self) -> None:
        """Read the run's active adapter from the store, which owns it (a cycle's promotion or rollback, `lessons
        forget`), and act with it: the loop's copy (what PLAY records and the summary shows) and the backend's
        weights, where the driver has a backend; the executors' workers are told by the executor."""
        self.adapter = self.store.active_adapter(self.run_id)
        if self._backend is not None:
            activate(self._backend, self.adapter)

    @property
    def config(self) -> RunConfig:
        return self.the_run.config

    @property
    def workdir(self) -> Path:
        return self.the_run.workdir

    @property
    def store(self) -> ExperienceStore:
        return self.the_run.store

    @property
    def run_id(self) -> int:
        return self.the_run.id

    @property
    def backend(self) -> PolicyBackend:
        """The driver's own policy (loaded on first use when the driver does not generate)."""
        if self._backend is None:
            self._backend = self._make_backend(self.config)
            self._act_with_run_adapter()
        return self._backend

    def _make_backend(self, config: RunConfig) -> PolicyBackend:
        """The driver's policy, checked against what the run needs of it before anything plays."""
        return make_backend(config.model, seed=config.seed, run=config, families=[e.family for e in self.envs])

    @property
    def executor(self) -> Executor:
        """Where the phases run: this process, or Ray workers (`runtime.executor`)."""
        if self._executor is None:
            k = self.config.agent.retrieved_examples
            examples = example_retriever(self.store, self.run_id, k, lambda: self.the_run.held)
            local = LocalExecutor(self.the_run, self.envs, lambda: self.backend, examples_for=examples if k else None)
            if self.config.runtime.executor == "ray":
                from agent_runtime.run.ray_executor import RayExecutor

                self._executor = RayExecutor(self.the_run, driver=local, stats=self.stats)
            else:
                self._executor = local
        return self._executor

    def request_stop(self, *_args) -> None:
        self.stop_requested = True

    # -- the state machine ---------------------------------------------------------------------------
    def _move(self, phase: str) -> None:
        assert phase in PHASES, phase
        release_memory()  # what the phase left (a trainer, its batches) goes back to the system before the next
        self.phase = phase
        self.store.update_run(self.run_id, phase=phase, state=self.state.stored())

    def run(self) -> RunSummary:
        started = time.monotonic()
        self.schedule = Schedule.starting_now(self.config, requested=self.requests)
        start_episodes = self.state.episodes
        start_tokens = self.stats.completion_tokens
        handler = _json_log(self.workdir)
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        previous = {sig: signal.signal(sig, self.request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        self.store.update_run(self.run_id, status="running")
        try:
            while not self.stop_requested:
                if self.phase == "PLAY":
                    before = self.schedule.before_play()
                    if before is not None:
                        self._move(before)
                        continue
                    if self.schedule.assess_due(self.state):
                        with self.profile.phase("ASSESS"):
                            self._assess()
                        continue
                    if self.schedule.over(self.state):
                        break
                    self._gate_user_lessons()
                    with self.profile.phase("PLAY"):
                        self._play(started, start_episodes, start_tokens)
                    if self.stop_requested:
                        break
                    after = self.schedule.after_play(self.state)
                    if after is not None:
                        self._move(after)
                    elif self.schedule.over(self.state) and not self.schedule.assess_due(self.state):
                        break
                elif self.phase == "EXTRACT":
                    with self.profile.phase("EXTRACT"):
                        self._extract()
                    self._move(self.schedule.after_extract(self.state))
                elif self.phase == "CONSOLIDATE":
                    with self.profile.phase("CONSOLIDATE"):
                        self._consolidate()
                    self._move("PLAY")
                else:
                    raise PhaseNotAvailableError(f"the run's cursor is at {self.phase}, which this version cannot run")
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)
            status = "finished" if self.schedule.target_reached(self.state) and self.phase == "PLAY" else "stopped"
            self.store.update_run(self.run_id, state=self.state.stored(), status=status)
            summary = self._summary(started, start_episodes, start_tokens)
            log.info(summary.line(), extra={"fields": {"summary": asdict(summary), "profile": self.profile.as_dict()}})
            log.removeHandler(handler)
            handler.close()
        return summary

    def _gate_user_lessons(self) -> None:
        """A person's lessons waiting for the gate are gated before the next episodes are played (here, by the
        driver's own policy: the model is loaded for it only when something waits)."""
        if not self.config.lessons.user_lessons_gated or pending_user_candidate(self.store, self.run_id) is None:
            return
        reason = gate_user_lessons(self.the_run, self.backend)
        if reason is not None:
            self.lessons.reload()
            log.info(f"lesson gate on a person's lessons: {reason}")
            tqdm.write(shown(f"lesson gate on a person's lessons: {reason}"))

    # -- PLAY -----------------------------------------------------------------------------------------
    def _play(self, started: float, start_episodes: int, start_tokens: int) -> None:
        self._probe_acting()
        executor = self.executor
        target = self.config.runtime.episodes
        done = self.state.episodes
        bar = tqdm(
            total=target,
            initial=min(done, target or done),
            desc=executor.label,
            unit="ep",
            disable=not self.progress,
            dynamic_ncols=True,
        )

        def on_commit(state: RunState) -> None:
            bar.update(1)
            bar.set_postfix(success=f"{state.won / state.episodes:.0%}")
            if state.episodes % self.config.runtime.summary_every == 0:
                self._summary_line(started, start_episodes, start_tokens, state)

        curriculum = self.config.curriculum
        if curriculum is not None:  # the pool's games that this phase does not play go until played again
            self.the_run.pool.keep_only(curriculum.phases[curriculum.phase_of(self.state.next_draw)].envs)
        session = PlaySession(
            self.state,
            self.schedule,
            self.sampler,
            self.store,
            self.run_id,
            context_for=self.lessons.for_draw,
            choose_lessons=self.lessons.choose,
            should_stop=lambda: self.stop_requested,
            on_commit=on_commit,
        )
        try:
            executor.play(session, self.adapter)
        finally:
            bar.close()
            self.state = session.state
            session.save()

    # -- EXTRACT --------------------------------------------------------------------------------------
    def _extract(self) -> None:
        """EXTRACT, which writes its results and the cursor's move in one transaction (`CursorMove`)."""
        recent = learnable_recent(self.the_run, self.config.lessons.episodes_per_extraction)
        after = replace(self.state, extractions=self.state.extractions + 1, last_extract_at=self.state.episodes)
        finish = CursorMove(self.schedule.after_extract(after), after.stored())
        report = self.executor.extract(recent, finish)
        self.state, self.phase = after, finish.phase
        self.lessons.reload()
        tqdm.write(shown(report.line()))
        for line in report.trial_lines():
            tqdm.write(shown(line))
        log.info(report.line(), extra={"fields": {"phase": "EXTRACT", **asdict(report)}})

    # -- CONSOLIDATE, EVALUATE, PROMOTE | ROLLBACK ------------------------------------------------------
    def _consolidate(self) -> None:
        """One OPCD cycle. The cycle row is the cursor inside it: a cycle found still running here was
        interrupted (the process died); it is rolled back and a fresh cycle starts."""
        roll_back_interrupted(self.store, self.run_id, "the process stopped during the cycle")
        bar = tqdm(
            total=self.config.opcd.trainer.steps,
            desc="CONSOLIDATE",
            unit="step",
            disable=not self.progress,
            dynamic_ncols=True,
        )

        def progress(metrics: dict) -> None:
            bar.update(1)
            bar.set_postfix(loss=f"{metrics['loss']:.3f}")

        def poll() -> None:  # a learner elsewhere writes the cycle's curves step by step; show them as they come
            for cycle in self.store.cycles(self.run_id, status="running"):
                losses = (cycle.curves or {}).get("loss", [])
                if len(losses) > bar.n:
                    bar.update(len(losses) - bar.n)
                    bar.set_postfix(loss=f"{losses[-1]:.3f}")

        # what the cycle writes with its outcome, in one transaction (with nothing to consolidate, no cycle counts)
        after = replace(self.state, cycles=self.state.cycles + 1, last_consolidate_at=self.state.episodes)
        skipped = replace(self.state, last_consolidate_at=self.state.episodes)
        asked = self.requests.pending(fresh=True)
        finish = CursorMove("PLAY", after.stored(), asked, state_if_skipped=skipped.stored())
        if asked:  # a re-consolidation after `lessons forget`: the adapter and the lessons it starts from
            self._act_with_run_adapter()
            self.lessons.reload()
        try:
            report = self.executor.consolidate(finish, progress=progress, on_poll=poll if self.progress else None)
        finally:
            bar.close()
        self.requests.carried_out(asked)
        self.state, self.phase = (skipped if report.status == "skipped" else after), finish.phase
        self._act_with_run_adapter()
        self.lessons.reload()
        tqdm.write(shown(report.line()))
        log.info(report.line(), extra={"fields": {"phase": "CONSOLIDATE", "cycle": asdict(report)}})
        if report.status == "promoted":  # the cycle stored the probe's reference where it ran: check against it
            with self.profile.phase("PROMOTE: probe"):
                self._probe_acting()

    def _probe_acting(self, reference=None) -> None:
        """When the loop's own backend plays (the local executor), check it against the probe of the adapter it
        acts with, once per adapter (after a promotion, and on a resumed run or after `lessons forget` switched
        the adapter); a stale backend raises `StaleAdapterError` before an episode is played with it."""
        adapter = self.adapter
        if self.config.runtime.executor != "local" or adapter is None or self._probed == adapter.id:
            return
        reference = reference or stored_reference(self.store, adapter)
        if reference is None:
            return
        result = check_backend(
            reference,
            self.backend,
            where=f"the loop's {self.backend.name} backend",
            tolerance=tolerance_for(self.config.model, self.backend.name),
            store=self.store,
            adapter=adapter,
        )
        self._probed = adapter.id
        if result.verdict == "adapter":  # the other verdicts are warnings, which the console shows already
            tqdm.write(shown(result.line()))

    # -- a curriculum's assessment ----------------------------------------------------------------------
    def _assess(self) -> None:
        """Every environment on the curriculum's held-out games as the agent acts now, stored with the state that
        counts it in one transaction (a run killed inside plays it again; one killed after never twice)."""
        index, clock = self.state.assessed, self._clock
        after = replace(self.state, assessed=index + 1)
        clock.start_assess()

        def record() -> dict:  # the round's lessons, drift, time and memory, beside its matrix row
            memory = memory_mb()
            seconds, peak = clock.lap(self.profile, memory)
            return round_fields(self.the_run, self.backend, self.adapter, seconds, memory.get("VmRSS"), peak)

        with self.store.transaction():
            assess(self.the_run, self.backend, index, self.adapter, round_record=record)
            self.store.update_run(self.run_id, state=after.stored())
        self.state = after
        line, fields = round_line(self.store, self.run_id, self.config, index)
        tqdm.write(shown(line))
        log.info(line, extra={"fields": fields})

    # -- reporting ------------------------------------------------------------------------------------
    def _summary(
        self, started: float, start_episodes: int, start_tokens: int, state: RunState | None = None
    ) -> RunSummary:
        """The run so far; `state`: the play session's, while it plays (the loop's own is set when PLAY ends)."""
        seconds = time.monotonic() - started
        stats, state = self.stats, state or self.state
        tokens = stats.completion_tokens - start_tokens
        return RunSummary(
            run_id=self.run_id,
            episodes=state.episodes,
            won=state.won,
            errors=state.errors,
            new_episodes=state.episodes - start_episodes,
            seconds=seconds,
            completion_tokens=tokens,
            tokens_per_s=stats.completion_tokens / stats.seconds if stats.seconds > 0 else 0.0,
            stopped_by_signal=self.stop_requested,
            extractions=state.extractions,
            lesson_set_version=self.lessons.version,
            cycles=state.cycles,
            adapter=self.adapter.name if self.adapter else None,
        )

    def _summary_line(
        self, started: float, start_episodes: int, start_tokens: int, state: RunState | None = None
    ) -> None:
        s = self._summary(started, start_episodes, start_tokens, state)
        rate = s.new_episodes / s.seconds * 60 if s.seconds else 0.0
        msg = f"{s.episodes} episodes, success {s.success_rate:.1%}, {s.tokens_per_s:.1f} tok/s, {rate:.1f} ep/min"
        tqdm.write(shown(msg))
        log.info(
            msg,
            extra={
                "fields": {
                    "episodes": s.episodes,
                    "success_rate": s.success_rate,
                    "tokens_per_s": s.tokens_per_s,
                    "episodes_per_min": rate,
                }
            },
        )

    def close(self) -> None:
        if self._executor is not None:
            self._executor.close()
        if self._backend is not None:
            self._backend.close()
        self.store.close()
