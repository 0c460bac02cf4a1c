"""PLAY on a Ray cluster: K rollout workers (Ray actors), one driver that owns the run.

With `runtime.executor: ray` the loop's PLAY phase hands draws to `RolloutWorker` actors instead of running
an `EpisodeRunner` in-process. The state machine, the task sampler, the lesson contexts and every episode
write stay on the driver. EXTRACT and CONSOLIDATE run on the `Learner`, a designated actor with its own
model (the GPU worker; OPCD data parallel over its GPUs), or on the driver with `runtime.ray.learner: driver`.

Why the driver is the only writer. Each committed episode is written in one transaction together with the
run state (episodes done, the next draw index, the draws still in flight), exactly as in the local path.
If workers wrote their episodes themselves, a worker could commit an episode whose draw the driver still
believes open, and a resume would replay it: exact resume would need a second protocol. Episode records
are small (kilobytes) next to the seconds it takes to play one, so funnelling them through the driver costs
little until hundreds of workers (see docs/scaling.md).

The protocol. The driver keeps, per worker, the set of draw indices it has handed out and not yet
committed. `RolloutWorker.advance(new_draws)` adds draws to the worker's queue, steps its slots (one batched
generate per turn, as locally) until at least one episode has finished, and returns the finished records.
The driver commits them, tops the worker up to its slot count and calls `advance` again, so a worker's
slots are refilled as soon as an episode ends. Each draw travels with its `EpisodeContext` (the lessons for
that draw), computed on the driver, so workers never read the store.

Faults. A worker that dies (killed, node lost, out of memory) fails its pending `advance`; its open draws go back to the
front of the queue and are played by the remaining workers; the run goes on. A draw is committed only if it is still
assigned to the worker that returns it, so nothing is committed twice. A draw that was in flight on `MAX_ATTEMPTS` dead
workers is committed as a lost episode (outcome "error") instead of being retried forever. A dead worker is replaced by
a fresh actor up to `runtime.ray.replace_workers` times. A learner that dies mid-phase is replaced and the phase reruns
from its start. If every worker is gone, the state is saved and `NoWorkersLeftError` is raised; `run --resume` replays
the open draws. The driver killed at any moment resumes like the local loop does, from the state committed with the last
episode.

A promoted adapter reaches the workers as a path: before each PLAY the driver tells every worker to load and
use the run's active adapter (the workers share the driver's filesystem or a network mount). With
`generation: server` the workers' chat backends have the vLLM server load it (runtime LoRA loading). Then
every worker (and a worker started later in a dead one's place) answers the adapter probe
(`agent_runtime.phases.probe`: the reference the learner stored with the adapter's cycle), and a worker that
does not act with the adapter stops the run with `StaleAdapterError` before it plays an episode.
"""

from __future__ import annotations

import logging
import math
import os
from collections import Counter, deque
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from agent_runtime.config import ConfigError, RunConfig, config_from_dict
from agent_runtime.episode.build import build_envs, build_prompt_builders, sampling_params
from agent_runtime.episode.runner import Draw, EpisodeContext, EpisodeRunner
from agent_runtime.llm import make_backend
from agent_runtime.llm.base import BackendStats, LocalModelBackend, activate
from agent_runtime.phases.consolidate import roll_back_interrupted, run_cycle
from agent_runtime.phases.extract import run_extract
from agent_runtime.phases.probe import (
    Measurement,
    ProbeReference,
    ProbeResult,
    StaleAdapterError,
    judge,
    measure,
    record_results,
    stored_reference,
    tolerance_for,
)
from agent_runtime.run.play import phase_plays
from agent_runtime.state import Run
from memory import AdapterInfo, EpisodeRecord, ExperienceStore

if TYPE_CHECKING:
    from agent_runtime.run.play import LocalExecutor, PlaySession
    from agent_runtime.state.cursor import CursorMove

log = logging.getLogger("agent_runtime.ray")

MAX_ATTEMPTS = 2  # worker deaths a draw may be in flight for before it is recorded as lost
LEARNER_ATTEMPTS = 2  # learner deaths a phase survives (each time on a fresh learner) before the run stops
_FORWARDED_ENV = ("AGENT_RUNTIME_", "HF_", "TRANSFORMERS_")


class NoWorkersLeftError(RuntimeError):
    """Every rollout worker died; the run's state is saved and `run --resume` continues it."""


class LearnerLostError(RuntimeError):
    """The learner died during a phase on every attempt; the run's state is saved and `run --resume` continues."""


class RolloutWorker:
    """One Ray actor: its own environment slots and policy backend (or the chat backend on a shared server)."""

    def __init__(self, config_data: dict, workdir: str, worker_id: int):
        config = config_from_dict(config_data, source=f"ray worker {worker_id}", stored=True)
        ray_config = config.runtime.ray
        self.worker_id = worker_id
        torch.manual_seed(config.seed + worker_id)
        model = config.model
        if ray_config.generation == "server":
            model = model.model_copy(update={"backend": "chat", "options": dict(ray_config.server)})
        self.envs, _ = build_envs(config, Path(workdir))
        self.backend = make_backend(
            model, seed=config.seed + worker_id, run=config, families=[e.family for e in self.envs]
        )
        params = sampling_params(model)
        self._queue: deque[Draw] = deque()
        self._contexts: dict[int, EpisodeContext] = {}
        self.runner = EpisodeRunner(
            self.backend,
            self.envs,
            build_prompt_builders(config, self.envs, self.backend),
            params,
            slots=ray_config.slots or config.runtime.slots,
            policy_name=config.model.name,
            context_for=lambda d: self._contexts.pop(d.index),
            explore=config.agent.explore,
            seed=config.seed,
            plays=phase_plays(config),
        )

    def slots(self) -> int:
        return self.runner.slots

    def activate(self, adapter: AdapterInfo | None) -> None:
        """Act with `adapter` (by its path, loaded on first use), or the base model (None)."""
        activate(self.backend, adapter)
        self.runner.adapter_id = adapter.id if adapter is not None else None

    def probe(self, reference: dict) -> tuple[Measurement, str]:
        """This worker's answers to the adapter probe (the driver judges them), and its backend's name."""
        return measure(self.backend, ProbeReference.from_json(reference)), self.backend.name

    def advance(self, assignments: list[tuple[Draw, EpisodeContext]]) -> tuple[list[EpisodeRecord], dict]:
        """Queue the new draws, play until at least one episode ends (or nothing is left), return the ended ones
        and the generation counters of this call."""
        for draw, context in assignments:
            self._queue.append(draw)
            self._contexts[draw.index] = context
        finished: list[EpisodeRecord] = []

        def on_episode(record: EpisodeRecord) -> None:
            record.metadata["worker"] = self.worker_id
            finished.append(record)

        stats = self.backend.stats
        before = (stats.calls, stats.prompt_tokens, stats.completion_tokens, stats.seconds)
        self.runner.run(lambda: self._queue.popleft() if self._queue else None, on_episode, lambda: bool(finished))
        after = (stats.calls, stats.prompt_tokens, stats.completion_tokens, stats.seconds)
        delta = dict(
            zip(("calls", "prompt_tokens", "completion_tokens", "seconds"), (b - a for a, b in zip(before, after)))
        )
        return finished, delta

    def close(self) -> None:
        self.runner.close()
        self.backend.close()


class Learner:
    """The designated worker of EXTRACT and CONSOLIDATE (a Ray actor; the GPU worker when there is one).

    It opens the run's store itself (the shared PostgreSQL, or the SQLite file on a shared disk) and writes what
    those phases write: extractions, lesson sets, OPCD cycles, adapters, evaluations. The run state is the
    driver's: it computes the cursor's move (`CursorMove`) and the learner writes it in the transaction of the
    phase's results, exactly as in the local loop, so a learner (or driver) killed mid-phase leaves the cursor
    on that phase and the phase runs again (an interrupted cycle is rolled back first), and one killed after
    it never runs it twice. With more than one GPU the OPCD trainer runs data-parallel over them.
    """

    def __init__(self, config_data: dict, workdir: str, run_id: int):
        """`config_data` is the run's config as the learner runs it (see `learner_config`); `run_id` the run in
        the store it opens (the driver's)."""
        config = config_from_dict(config_data, source="ray learner", stored=True)
        torch.manual_seed(config.seed)
        self.backend = make_backend(config.model, seed=config.seed, run=config)
        store = ExperienceStore.open(config.memory.url or Path(workdir), embedder=config.memory.embedder)
        self.run = Run(config, Path(workdir), store, run_id)

    def where(self) -> dict:
        """Where this learner runs: process, host and device (recorded with the phases it ran)."""
        import socket

        device = self.backend.device if isinstance(self.backend, LocalModelBackend) else None
        import ray

        return {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "device": str(device) if device else None,
            "ray_gpu_ids": [str(i) for i in ray.get_gpu_ids()],
            "processes": self.run.config.opcd.trainer.processes,
        }

    def _act_with_run_adapter(self) -> None:
        activate(self.backend, self.run.store.active_adapter(self.run.id))

    def extract(self, episode_ids: list[int], finish: CursorMove):
        self._act_with_run_adapter()
        return run_extract(self.run, self.backend, episode_ids, finish=finish)

    def consolidate(self, finish: CursorMove):
        self._act_with_run_adapter()
        report = run_cycle(self.run, self.backend, finish=finish)
        if report.cycle_id is not None:
            report.metrics["learner"] = self.where()
            self.run.store.update_cycle(report.cycle_id, metrics=report.metrics)
        return report

    def close(self) -> None:
        self.backend.close()
        self.run.store.close()


def _import_ray():
    try:
        import ray
    except ImportError as exc:
        raise ConfigError(
            "runtime.executor: ray needs the `ray` package (pip install 'ray==2.60.0'); or set runtime.executor: local"
        ) from exc
    return ray


def _worker_env() -> dict[str, str]:
    """The environment a worker needs to import this project and share its caches, wherever Ray starts it."""
    root = str(Path(__file__).resolve().parent.parent)
    env = {k: v for k, v in os.environ.items() if k.startswith(_FORWARDED_ENV)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    return env


def learner_gpus(ray_config, available: dict) -> float:
    """The learner's GPUs: as configured, else one when the cluster has a GPU the rollout workers leave free."""
    if ray_config.learner_gpus is not None:
        return ray_config.learner_gpus
    free = available.get("GPU", 0.0) - ray_config.workers * ray_config.worker_gpus
    return 1.0 if free >= 1 else 0.0


def learner_config(config: RunConfig, gpus: float) -> dict:
    """The run's config as the learner runs it: its model on `learner_device`, and OPCD data parallel over its
    GPUs (one rank per GPU) unless `opcd.trainer.processes` says otherwise."""
    data = config.model_dump(mode="json")
    data["model"]["device"] = config.runtime.ray.learner_device
    if int(gpus) > 1 and config.opcd.trainer.processes == 1:
        data["opcd"]["trainer"]["processes"] = int(gpus)
    return data


def _check_resources(available: dict, ray_config, learner: dict[str, float]) -> None:
    """Fail now, with the numbers, instead of waiting forever for workers the cluster cannot place;
    `learner` is what the learner takes ({} when no phase runs on it)."""
    for name, per_worker in (("CPU", ray_config.worker_cpus), ("GPU", ray_config.worker_gpus)):
        extra = learner.get(name, 0.0)
        need, have = ray_config.workers * per_worker + extra, available.get(name, 0.0)
        if need > have:
            plus = f" + the learner's {extra:g}" if extra else ""
            raise ConfigError(
                f"runtime.ray: {ray_config.workers} workers x {per_worker} {name}{plus} = {need:g} "
                f"{name}s, but the Ray cluster has {have:g}; lower runtime.ray.workers or "
                f"worker_{name.lower()}s, or add nodes"
            )


def lost_record(draw: Draw, env_id: str, policy: str, attempts: int) -> EpisodeRecord:
    """The record committed for a draw whose workers kept dying: an errored episode, so the run can go on."""
    now = datetime.now(UTC)
    return EpisodeRecord(
        env_id=env_id,
        task_id=draw.task_id,
        seed=draw.seed,
        policy=policy,
        adapter_id=None,
        lesson_set_version=None,
        outcome="error",
        won=False,
        total_return=0.0,
        prompt_tokens=0,
        completion_tokens=0,
        started_at=now,
        ended_at=now,
        error=f"lost: in flight on {attempts} rollout workers that died",
        metadata={"draw": draw.index, "lost": True},
    )


class RayExecutor:
    """The driver's side: starts the workers, hands out a `PlaySession`'s draws, commits what comes back through
    it, and survives worker and learner deaths. EXTRACT and CONSOLIDATE run on the learner, or on `driver` (the
    in-process executor) with `runtime.ray.learner: driver`."""

    def __init__(self, run: Run, *, driver: LocalExecutor, stats: BackendStats | None = None):
        config, workdir = run.config, run.workdir
        self.run_id = run.id
        ray_config = config.runtime.ray
        ray = _import_ray()
        self._ray = ray
        self._ray_config = ray_config
        self.driver = driver
        self.stats = stats if stats is not None else BackendStats()  # the workers' generation, summed
        self._owns_cluster = not ray.is_initialized()
        uses_learner = ray_config.learner == "worker" and (config.lessons.enabled or config.opcd.enabled)
        if self._owns_cluster:
            need = ray_config.workers * ray_config.worker_cpus + ray_config.learner_cpus * uses_learner
            local = {} if ray_config.address else {"num_cpus": max(os.cpu_count() or 1, math.ceil(need))}
            ray.init(address=ray_config.address, include_dashboard=False, log_to_driver=False, **local)
        available = ray.cluster_resources()
        gpus = learner_gpus(ray_config, available)
        _check_resources(available, ray_config, {"CPU": ray_config.learner_cpus, "GPU": gpus} if uses_learner else {})
        env = {"env_vars": _worker_env()}
        self._worker_class = ray.remote(RolloutWorker).options(
            num_cpus=ray_config.worker_cpus, num_gpus=ray_config.worker_gpus, max_restarts=0, runtime_env=env
        )
        self._learner_class = ray.remote(Learner).options(
            num_cpus=ray_config.learner_cpus, num_gpus=gpus, max_restarts=0, runtime_env=env
        )
        self._data, self._workdir = config.model_dump(mode="json"), str(workdir)
        self._learner_data = learner_config(config, gpus)
        self._policy, self._env_ids = config.model.name, [e.id for e in config.envs]
        self._model_config = config.model
        self._slots_per_worker = ray_config.slots or config.runtime.slots
        self.workers: dict[int, object] = {}
        self.slots: dict[int, int] = {}
        self.assigned: dict[int, set[int]] = {}
        self.dead: list[int] = []  # workers lost, in order
        self.replaced: list[int] = []  # workers started in place of dead ones, in order
        self.requeued: list[int] = []  # draws taken back from dead workers, in order
        self._attempts: Counter[int] = Counter()
        self._adapter: tuple | None = None  # (name, path, id) the workers act with
        self._adapter_info: AdapterInfo | None = None
        self._next_worker = 0
        self.learner = None  # started on the first EXTRACT or CONSOLIDATE
        self.learners_lost = 0
        self.poll_hooks: list[Callable[[], None]] = []  # called while the driver waits on the learner (tests)
        for _ in range(ray_config.workers):
            self._start_worker()

    @property
    def label(self) -> str:
        return f"PLAY x{len(self.workers)}"

    def _start_worker(self) -> int:
        """A fresh rollout worker (acting with the current adapter); its id is never reused."""
        worker_id = self._next_worker
        self._next_worker += 1
        actor = self._worker_class.remote(self._data, self._workdir, worker_id)
        if self._adapter is not None:
            actor.activate.remote(self._adapter_info)  # actor calls run in order: before its first advance
        self.workers[worker_id], self.slots[worker_id], self.assigned[worker_id] = actor, self._slots_per_worker, set()
        if self._adapter_info is not None:
            self.probe_workers(self._adapter_info, [worker_id])
        return worker_id

    def in_flight(self) -> list[int]:
        return sorted(i for draws in self.assigned.values() for i in draws)

    def broadcast_adapter(self, adapter: AdapterInfo | None) -> None:
        """Make every worker act with `adapter` (by path) or the base model (None)."""
        key = (adapter.name, str(adapter.path), adapter.id) if adapter is not None else (None, None, None)
        if key == self._adapter:
            return
        self._ray.get([w.activate.remote(adapter) for w in self.workers.values()])
        self._adapter, self._adapter_info = key, adapter
        if adapter is not None:
            self.probe_workers(adapter, list(self.workers))

    def probe_workers(self, adapter: AdapterInfo, worker_ids: list[int]) -> list[ProbeResult]:
        """The adapter probe on the given workers, all at once; the verdicts go with the adapter's cycle, and a
        worker that does not act with `adapter` raises `StaleAdapterError` (naming it). An adapter no cycle of
        this version trained (no stored reference) is not probed."""
        store = self.driver.run.store
        reference = stored_reference(store, adapter)
        if reference is None:
            log.warning("adapter probe: no reference stored for adapter %s; its workers are not probed", adapter.name)
            return []
        answers = self._ray.get([self.workers[w].probe.remote(reference.as_json()) for w in worker_ids])
        results, stale = [], None
        for worker, (measured, backend_name) in zip(worker_ids, answers):
            where = f"rollout worker {worker} ({backend_name} backend)"
            try:
                results.append(
                    judge(reference, measured, where=where, tolerance=tolerance_for(self._model_config, backend_name))
                )
            except StaleAdapterError as exc:
                results.append(exc.result)
                stale = stale or exc
        record_results(store, adapter, results)
        if stale is not None:
            raise stale
        return results

    def _fitted(self, session: PlaySession, draw: Draw) -> EpisodeContext:
        """The draw's lessons fitted to the budget here, before the game is reset on a worker: their relevance is
        judged on the environment and task alone (a local run also reads the first observation)."""
        context = session.context_for(draw)
        if session.choose_lessons is None or not context.lessons:
            return context
        return session.choose_lessons(context, self._env_ids[draw.env_index], draw.task_id, "")

    def play(self, session: PlaySession, adapter: AdapterInfo | None) -> None:
        """One PLAY phase on the workers: the session's draws, each finished episode committed through it."""
        ray = self._ray
        assert not self.in_flight(), "a previous PLAY left draws on the workers"
        self.broadcast_adapter(adapter)
        pending: dict = {}

        def dispatch(worker: int) -> None:
            batch = []
            while len(self.assigned[worker]) < self.slots[worker] and (draw := session.next_draw()) is not None:
                batch.append((draw, self._fitted(session, draw)))
                self.assigned[worker].add(draw.index)
            if self.assigned[worker]:
                pending[self.workers[worker].advance.remote(batch)] = worker

        def commit(worker: int, record: EpisodeRecord) -> None:
            index = record.metadata["draw"]
            if index not in self.assigned[worker]:
                log.warning("dropped a second result for draw %d from worker %d", index, worker)
                return
            self.assigned[worker].discard(index)
            session.commit(record)

        def lose(worker: int, exc: Exception) -> None:
            orphans = sorted(self.assigned.pop(worker))
            del self.workers[worker], self.slots[worker]
            self.dead.append(worker)
            log.warning(
                "rollout worker %d died (%s); re-queueing draws %s",
                worker,
                type(exc).__name__,
                orphans,
                extra={"fields": {"worker": worker, "requeued": orphans}},
            )
            self._attempts.update(orphans)
            self.requeued.extend(orphans)
            session.give_back([i for i in orphans if self._attempts[i] < MAX_ATTEMPTS])
            for index in orphans:
                if self._attempts[index] >= MAX_ATTEMPTS:
                    draw = session.sampler.draw(index)
                    session.commit(
                        lost_record(draw, self._env_ids[draw.env_index], self._policy, self._attempts[index])
                    )
            if len(self.replaced) < self._ray_config.replace_workers:
                fresh = self._start_worker()
                self.replaced.append(fresh)
                log.warning(
                    "started rollout worker %d in place of worker %d",
                    fresh,
                    worker,
                    extra={"fields": {"worker": fresh, "replaces": worker}},
                )
            if not self.workers:
                raise NoWorkersLeftError(
                    f"all rollout workers died (last: worker {worker}, {exc}); the run's "
                    "state is saved: `run --resume` replays the open draws"
                )
            busy = set(pending.values())
            for other in self.workers:
                if other not in busy:
                    dispatch(other)

        try:
            for worker in list(self.workers):
                dispatch(worker)
            while pending and not session.should_stop():
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
                for ref in ready:
                    worker = pending.pop(ref)
                    try:
                        records, stats = ray.get(ref)
                    except ray.exceptions.RayActorError as exc:
                        lose(worker, exc)
                        continue
                    for name, value in stats.items():
                        setattr(self.stats, name, getattr(self.stats, name) + value)
                    for record in records:
                        commit(worker, record)
                    dispatch(worker)
        finally:
            if pending or self.in_flight():  # stopped mid-phase: the workers' episodes are abandoned (open draws)
                self.close()

    # EXTRACT and CONSOLIDATE on the learner (or the driver) ----------------------------------------------
    def _learner_is_driver(self) -> bool:
        return self._ray_config.learner == "driver"

    def extract(self, episode_ids: list[int], finish: CursorMove):
        """`run_extract` on the learner, which writes the cursor's move with the phase's results."""
        if self._learner_is_driver():
            return self.driver.extract(episode_ids, finish)
        return self._on_learner("extract", episode_ids, finish)

    def consolidate(
        self,
        finish: CursorMove,
        progress: Callable[[dict], None] | None = None,
        on_poll: Callable[[], None] | None = None,
    ):
        """One OPCD cycle on the learner; `on_poll` runs while the driver waits (it shows the cycle's progress)."""
        if self._learner_is_driver():
            return self.driver.consolidate(finish, progress=progress)
        return self._on_learner("consolidate", finish, on_poll=on_poll)

    def _on_learner(self, method: str, *args, on_poll: Callable[[], None] | None = None):
        """Run a phase on the learner. A learner that dies is replaced and the phase runs again from its start
        (a half-done cycle is rolled back first, as on resume); after LEARNER_ATTEMPTS deaths the run stops
        with its cursor on the phase, for `run --resume`."""
        ray = self._ray
        attempt = 0
        while True:
            attempt += 1
            if self.learner is None:
                self.learner = self._learner_class.remote(self._learner_data, self._workdir, self.run_id)
            ref = getattr(self.learner, method).remote(*args)
            try:
                while not ray.wait([ref], timeout=0.5)[0]:
                    for hook in [*self.poll_hooks, *([on_poll] if on_poll else [])]:
                        hook()
                return ray.get(ref)
            except ray.exceptions.RayActorError as exc:
                self.learner = None
                self.learners_lost += 1
                roll_back_interrupted(self.driver.run.store, self.run_id, "the learner died during the cycle")
                log.warning(
                    "the learner died during %s (attempt %d of %d): %s",
                    method.upper(),
                    attempt,
                    LEARNER_ATTEMPTS,
                    type(exc).__name__,
                    extra={"fields": {"phase": method}},
                )
                if attempt == LEARNER_ATTEMPTS:
                    raise LearnerLostError(
                        f"the learner died {attempt} times during {method.upper()}; the run's "
                        "state is saved: `run --resume` runs the phase again"
                    ) from exc

    def close(self) -> None:
        """Kill the workers and the learner (and the local cluster, if this executor started it)."""
        for worker in self.workers.values():
            self._ray.kill(worker)
        if self.learner is not None:
            self._ray.kill(self.learner)
            self.learner = None
        self.workers, self.slots, self.assigned = {}, {}, {}
        self._adapter = self._adapter_info = None
        if self._owns_cluster and self._ray.is_initialized():
            self._ray.shutdown()
        self._owns_cluster = False
