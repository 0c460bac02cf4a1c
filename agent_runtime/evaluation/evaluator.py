"""Held-out evaluation: each environment's eval split, the same tasks and seeds every time.

Task i of an environment's eval split is always played with seed `evaluation.seed + i`, and decoding is
greedy by default, so two policies (an adapter against its parent, lessons in context against none) are
compared on identical games. Evaluation episodes are not written as experience (they must not leak into
lesson extraction or the OPCD prompt pool); each environment's result is stored as one evaluation row whose
metrics hold the per-episode outcomes, so a later comparison can pair them task by task.

Reuse between calls: one OPCD cycle evaluates 5-9 times and the lesson gate and trials more, on the same
environments. An `EnvPool` (by default one per process, closed at exit or by `close_env_pool`) keeps what a call
built for the next one: the environment specs and task lists (keyed by the env entries, the split, the workdir
and its game cache) and the started environment instances (a TextWorld game's interpreter process: a fresh one
is slow to start, a reused one quick to load another game), keyed by the entry that builds them, the
split, workdir and game cache. The runner borrows instances from it and gives back, after the run, those that are between
episodes; every episode `reset`s its instance onto its task and seed, so the outcome is the one a fresh
instance gives when the environment keeps the contract (`check_env` plays a reused instance against a fresh one).
An instance is never lent across splits: one that a cycle's validation games or anchor play used on the train
split would carry whatever a faulty reset left behind (a key picked up in a train game) into the held-out
evaluation, which must score the same on any pool as on a fresh one. An instance whose reset or step failed is closed, never given back, and after a run that raised
nothing is given back. When a curriculum phase starts, the pool keeps only the instances of the environments it plays
(`EnvPool.keep_only`). `reuse=False` builds everything anew, as before.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from agent_runtime.config import EnvEntry, RunConfig
from agent_runtime.episode.build import build_envs, build_prompt_builders
from agent_runtime.episode.runner import NO_CONTEXT, Draw, EnvSlotSpec, EpisodeContext, EpisodeRunner
from agent_runtime.llm.base import PolicyBackend, SamplingParams
from distill.lessons.budget import LessonBudget
from distill.lessons.scope import ScopedLesson, in_scope_lessons
from environments.game_cache import run_games_dir
from environments.registry import check_env_id
from memory import EpisodeRecord
from memory.intervals import wilson_interval


@dataclass
class EvalResult:
    env_id: str
    episodes: list[dict] = field(default_factory=list)  # task_id, seed, won, return, steps, outcome

    @property
    def n(self) -> int:
        return len(self.episodes)

    @property
    def successes(self) -> int:
        return sum(1 for e in self.episodes if e["won"])

    @property
    def success_rate(self) -> float:
        return self.successes / self.n if self.n else 0.0

    @property
    def interval(self) -> tuple[float, float]:
        return wilson_interval(self.successes, self.n)

    @property
    def mean_return(self) -> float:
        return sum(e["return"] for e in self.episodes) / self.n if self.n else 0.0

    def line(self) -> str:
        lo, hi = self.interval
        return (
            f"{self.env_id:<28} {self.successes:>4}/{self.n:<4} success {self.success_rate:6.1%} "
            f"[95% CI {lo:.1%}-{hi:.1%}]  mean return {self.mean_return:.2f}"
        )


def entry_key(entry: EnvEntry, workdir: Path, split: str, *, whole: bool) -> str:
    """What decides an entry's spec (`whole`: the whole entry) or what its factory builds (its id and keyword
    arguments), with the split the instances play, the workdir and its game cache."""
    what = entry.model_dump(mode="json") if whole else {"id": entry.id, "kwargs": entry.kwargs}
    return json.dumps(
        {
            "entry": what,
            "split": split,
            "workdir": str(Path(workdir).resolve()),
            "games": str(run_games_dir(workdir).resolve()),
        },
        sort_keys=True,
        default=repr,
    )


class EnvPool:
    """Built environment specs and started environment instances, kept between evaluations in one process.

    At most `max_idle` instances wait (a TextWorld one holds a game process): beyond that, those of the key given
    back longest ago are closed. Thread-safe; after a fork the child forgets what the parent held (its processes
    and sockets are the parent's) without closing it. `close()` closes the idle instances and forgets the specs;
    the pool can be used again after it.
    """

    def __init__(self, max_idle: int = 32) -> None:
        self.max_idle = max_idle
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._specs: dict[tuple, tuple[list[EnvSlotSpec], list[tuple[str, ...]]]] = {}
        self._idle: OrderedDict[str, list[object]] = OrderedDict()
        self.started = 0  # instances built by the pool's factories
        self.reused = 0  # instances lent again

    def _same_process(self) -> None:
        if self._pid != os.getpid():
            self._specs, self._idle, self._pid = {}, OrderedDict(), os.getpid()

    def envs(
        self, config: RunConfig, workdir: Path, split: str
    ) -> tuple[list[EnvSlotSpec], list[list[str]], list[str]]:
        """`build_envs(config, workdir, split)`, built once per key; and each spec's instance key (the split's own:
        instances are never lent across splits)."""
        for entry in config.envs:  # the code-trust check runs on every call, as build_envs does
            check_env_id(entry.id)
        keys = [entry_key(entry, workdir, split, whole=False) for entry in config.envs]
        spec_key = tuple(entry_key(entry, workdir, split, whole=True) for entry in config.envs)
        with self._lock:
            self._same_process()
            built = self._specs.get(spec_key)
        if built is None:
            specs, tasks = build_envs(config, Path(workdir).resolve(), split=split)
            built = specs, [tuple(t) for t in tasks]
            with self._lock:
                self._specs[spec_key] = built
        return list(built[0]), [list(t) for t in built[1]], keys

    def borrow(self, key: str, factory: Callable[[], object]) -> object:
        with self._lock:
            self._same_process()
            idle = self._idle.get(key)
            if idle:
                self.reused += 1
                return idle.pop()
            self.started += 1
        return factory()

    def give_back(self, key: str, env: object) -> None:
        evicted = []
        with self._lock:
            if self._pid == os.getpid():
                self._idle.setdefault(key, []).append(env)
                self._idle.move_to_end(key)
                while sum(len(v) for v in self._idle.values()) > self.max_idle:
                    oldest = next(iter(self._idle))
                    evicted.append(self._idle[oldest].pop(0))
                    if not self._idle[oldest]:
                        del self._idle[oldest]
            else:  # a parent's pool in a forked child: the instance was built here, so it is closed here
                evicted.append(env)
        for old in evicted:
            with contextlib.suppress(Exception):
                old.close()

    def keep_only(self, env_ids: Collection[str]) -> int:
        """Close the waiting instances of every environment not in `env_ids`, whatever their split: when a curriculum
        phase starts, the games it does not play go (a JVM game's instance holds much memory) until an assessment or a
        cycle plays them again. Returns how many were closed."""
        keep = set(env_ids)
        with self._lock:
            if self._pid != os.getpid():
                return 0
            gone = [key for key in self._idle if json.loads(key)["entry"]["id"] not in keep]
            envs = [env for key in gone for env in self._idle.pop(key)]
        for env in envs:
            with contextlib.suppress(Exception):
                env.close()
        return len(envs)

    def idle(self) -> int:
        """How many started instances wait to be lent."""
        with self._lock:
            return sum(len(v) for v in self._idle.values())

    def close(self) -> None:
        with self._lock:
            mine = self._pid == os.getpid()
            envs = [env for idle in self._idle.values() for env in idle] if mine else []
            self._specs, self._idle, self._pid = {}, OrderedDict(), os.getpid()
        for env in envs:
            with contextlib.suppress(Exception):  # one broken close must not keep the others open
                env.close()


class _Lending:
    """An `EnvLender` for one runner: env index -> the pool's key and factory."""

    def __init__(self, pool: EnvPool, keys: list[str], specs: list[EnvSlotSpec]):
        self.pool, self.keys, self.specs = pool, keys, specs

    def borrow(self, env_index: int) -> object:
        return self.pool.borrow(self.keys[env_index], self.specs[env_index].factory)

    def give_back(self, env_index: int, env: object) -> None:
        self.pool.give_back(self.keys[env_index], env)


_POOL: EnvPool | None = None
_POOL_LOCK = threading.Lock()


def env_pool() -> EnvPool:
    """This process's pool (made on first use, closed at exit)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = EnvPool()
            atexit.register(_POOL.close)
        return _POOL


def close_env_pool() -> None:
    """Close this process's pool's instances and forget its specs (the next evaluation starts cold)."""
    if _POOL is not None:
        _POOL.close()


def evaluate(
    config: RunConfig,
    workdir: Path,
    backend: PolicyBackend,
    *,
    lessons: Sequence[str | ScopedLesson] | None = None,
    budget: LessonBudget | None = None,
    episodes_per_env: int | None = None,
    first: int = 0,
    slots: int | None = None,
    split: str = "eval",
    context: str | None = None,
    reuse: bool = True,
    pool: EnvPool | None = None,
    on_record: Callable[[EpisodeRecord], None] | None = None,
) -> list[EvalResult]:
    """Play the first N tasks of `split` (the held-out eval split by default) of every environment of the
    config (`first`: N tasks from that one on, each with the seed it always has); return one result per
    environment. `lessons`: each environment's prompt shows those in its scope (a plain string: every
    environment), fitted to `budget` for each episode's goal and first observation as PLAY fits them
    (`LessonBudget.select`; None: all of them). `context`: a system prompt appended to every system message
    (a system-prompt distillation cycle's "with context" conditions). `pool`: where specs and started
    instances are kept between calls (default: this process's, `env_pool()`); `reuse=False`: none kept.
    `on_record`: called with each finished episode's whole record (its steps), for a caller that needs the turns."""
    n = episodes_per_env or config.evaluation.episodes_per_env
    lender = None
    if reuse:
        pool = pool if pool is not None else env_pool()
        specs, task_lists, keys = pool.envs(config, workdir, split)
        lender = _Lending(pool, keys, specs)
    else:
        specs, task_lists = build_envs(config, workdir, split=split)
    builders = build_prompt_builders(config, specs, backend, context)
    shown = {spec.env_id: in_scope_lessons(lessons or [], spec.env_id, spec.family) for spec in specs}

    def context_for(draw: Draw) -> EpisodeContext:
        texts = tuple(x.text for x in shown[specs[draw.env_index].env_id])
        return EpisodeContext(texts) if texts else NO_CONTEXT

    def choose_lessons(context: EpisodeContext, env_id: str, goal: str, observation: str) -> EpisodeContext:
        chosen = budget.select(shown[env_id], env_id, goal, observation) if budget is not None else shown[env_id]
        return EpisodeContext(tuple(x.text for x in chosen), tuple(x.id for x in chosen if x.id is not None))

    params = SamplingParams(
        max_new_tokens=config.model.max_new_tokens, temperature=config.evaluation.temperature, top_p=config.model.top_p
    )
    queue = [
        Draw(index=len(specs) * i + e, env_index=e, task_id=tasks[i], seed=config.evaluation.seed + i)
        for e, tasks in enumerate(task_lists)
        for i in range(first, min(first + n, len(tasks)))
    ]
    results = [EvalResult(spec.env_id) for spec in specs]

    def on_episode(record: EpisodeRecord) -> None:
        if on_record is not None:
            on_record(record)
        env_index = next(i for i, s in enumerate(specs) if s.env_id == record.env_id)
        results[env_index].episodes.append(
            {
                "task_id": record.task_id,
                "seed": record.seed,
                "won": record.won,
                "return": record.total_return,
                "steps": len(record.steps),
                "outcome": record.outcome,
            }
        )

    torch.manual_seed(config.evaluation.seed)
    runner = EpisodeRunner(
        backend,
        specs,
        builders,
        params,
        slots=slots or config.runtime.slots,
        policy_name=config.model.name,
        lender=lender,
        seed=config.evaluation.seed,
        context_for=context_for,
        choose_lessons=choose_lessons,
    )
    finished = False
    try:
        runner.run(lambda: queue.pop(0) if queue else None, on_episode)
        finished = True
    finally:
        runner.close(give_back=finished)
    for result in results:
        result.episodes.sort(key=lambda e: e["seed"])
    return results
