"""The long-lived loop: a persisted state machine, one row per run in the experience store.

    PLAY -> EXTRACT (every N episodes) -> CONSOLIDATE (every M episodes) -> EVALUATE -> PROMOTE | ROLLBACK -> PLAY

Each phase commits its results in one transaction before the phase cursor moves. During PLAY that means
every finished episode is written together with the run's new state (episodes done, the next draw index,
the draws still in flight), so `kill -9` at any moment followed by `run --resume` loses at most the
episodes that were in flight, and re-plays exactly those draws: nothing is lost or duplicated.

SIGINT or SIGTERM asks the loop to stop: the current turn finishes, its episodes are committed, and the
process exits 0. The run can then be resumed.
"""

from __future__ import annotations

import json
import logging
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from agent_runtime.config import ConfigError, RunConfig, config_from_dict, save_resolved
from agent_runtime.llm import PolicyBackend, SamplingParams, make_backend
from agent_runtime.envs import build_envs, build_prompt_builders
from agent_runtime.runner import Draw, EpisodeRunner, TaskSampler
from memory import EpisodeRecord, ExperienceStore

log = logging.getLogger("agent_runtime.loop")

PHASES = ("PLAY", "EXTRACT", "CONSOLIDATE", "EVALUATE", "PROMOTE", "ROLLBACK")


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

    @property
    def success_rate(self) -> float:
        return self.won / self.episodes if self.episodes else 0.0

    def line(self) -> str:
        return (f"run {self.run_id}: {self.episodes} episodes ({self.new_episodes} this session), "
                f"success {self.success_rate:.1%}, errors {self.errors}, "
                f"{self.tokens_per_s:.1f} generated tokens/s, {self.seconds:.1f}s")


def default_workdir(config_name: str) -> Path:
    return Path("runs") / config_name


def check_phases(config: RunConfig) -> None:
    if config.lessons.enabled:
        raise PhaseNotAvailableError(
            "lessons.enabled: the EXTRACT phase (lesson extraction) is not available in this version yet; "
            "set lessons.enabled: false")
    if config.opcd.enabled:
        raise PhaseNotAvailableError(
            "opcd.enabled: the CONSOLIDATE phase (OPCD) is not available in this version yet; set opcd.enabled: false")


def _json_log(workdir: Path) -> logging.Handler:
    handler = logging.FileHandler(workdir / "run.log.jsonl")

    class _Fmt(logging.Formatter):
        def format(self, record: logging.LogRecord) -> str:
            payload = {"time": self.formatTime(record), "level": record.levelname, "msg": record.getMessage()}
            payload.update(getattr(record, "fields", {}))
            return json.dumps(payload)

    handler.setFormatter(_Fmt())
    return handler


class AgentLoop:
    def __init__(self, config: RunConfig, workdir: Path, *, resume: bool = False,
                 backend: PolicyBackend | None = None, progress: bool = True):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.store = ExperienceStore.open(config.memory.url or self.workdir)
        existing = self.store.find_run(config.name)
        if resume:
            if existing is None:
                raise ConfigError(f"--resume: no run named {config.name!r} in {self.store.url}; start one without --resume")
            stored = config_from_dict(existing.config, source=f"run {existing.id} in {self.store.url}")
            # the stop conditions may change on resume; everything that shapes the episodes may not
            stored.runtime.episodes = config.runtime.episodes
            stored.runtime.hours = config.runtime.hours
            config = stored
        check_phases(config)
        self.config = config
        save_resolved(config, self.workdir)
        self.envs, tasks = build_envs(config, self.workdir)
        self.sampler = TaskSampler([e.weight for e in config.envs], tasks, config.seed)
        self.backend = backend or make_backend(config.model, seed=config.seed)
        torch.manual_seed(config.seed)
        if resume:
            self.run_id = existing.id
            self.state = dict(existing.state or {})
        else:
            self.run_id = self.store.create_run(config.name, config.model_dump(mode="json"))
            self.state = {}
        for key in ("episodes", "won", "errors", "next_draw"):
            self.state.setdefault(key, 0)
        self.state.setdefault("open_draws", [])
        self.progress = progress
        self._stop_requested = False

    def request_stop(self, *_args) -> None:
        self._stop_requested = True

    def run(self) -> RunSummary:
        target = self.config.runtime.episodes
        deadline = time.monotonic() + self.config.runtime.hours * 3600 if self.config.runtime.hours else None
        reopen = list(self.state["open_draws"])
        start_episodes = self.state["episodes"]
        started = time.monotonic()
        start_tokens = self.backend.stats.completion_tokens if hasattr(self.backend, "stats") else 0
        model = self.config.model
        params = SamplingParams(max_new_tokens=model.max_new_tokens, temperature=model.temperature, top_p=model.top_p)
        builders = build_prompt_builders(self.config, self.envs, self.backend)
        runner = EpisodeRunner(self.backend, self.envs, builders, params, slots=self.config.runtime.slots,
                               policy_name=model.name)
        handler = _json_log(self.workdir)
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        bar = tqdm(total=target, initial=min(start_episodes, target or start_episodes), desc="PLAY",
                   unit="ep", disable=not self.progress, dynamic_ncols=True)

        def next_draw() -> Draw | None:
            if reopen:
                return self.sampler.draw(reopen.pop(0))
            in_flight = len(runner.in_flight())
            if target is not None and self.state["episodes"] + in_flight >= target:
                return None
            if deadline is not None and time.monotonic() > deadline:
                return None
            index = self.state["next_draw"]
            self.state["next_draw"] = index + 1
            return self.sampler.draw(index)

        def on_episode(record: EpisodeRecord) -> None:
            self.state["episodes"] += 1
            self.state["won"] += int(record.won)
            self.state["errors"] += int(record.outcome == "error")
            self.state["open_draws"] = sorted(runner.in_flight() + reopen)
            self.store.add_episode(self.run_id, record, run_state=self.state)
            bar.update(1)
            done = self.state["episodes"]
            bar.set_postfix(success=f"{self.state['won'] / done:.0%}")
            if done % self.config.runtime.summary_every == 0:
                self._summary_line(started, start_episodes, start_tokens)

        def should_stop() -> bool:
            return self._stop_requested or (deadline is not None and time.monotonic() > deadline
                                             and not runner.in_flight())

        previous = {sig: signal.signal(sig, self.request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        self.store.update_run(self.run_id, phase="PLAY", status="running")
        try:
            runner.run(next_draw, on_episode, should_stop)
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)
            runner.close()
            bar.close()
            self.state["open_draws"] = sorted(runner.in_flight() + reopen)
            finished = target is not None and self.state["episodes"] >= target and not self.state["open_draws"]
            self.store.update_run(self.run_id, state=self.state,
                                  status="finished" if finished else "stopped")
            log.removeHandler(handler)
            handler.close()
        summary = self._summary(started, start_episodes, start_tokens)
        log.info(summary.line(), extra={"fields": {"summary": asdict(summary)}})
        return summary

    def _summary(self, started: float, start_episodes: int, start_tokens: int) -> RunSummary:
        seconds = time.monotonic() - started
        tokens = (self.backend.stats.completion_tokens if hasattr(self.backend, "stats") else 0) - start_tokens
        gen_seconds = self.backend.stats.seconds if hasattr(self.backend, "stats") else seconds
        return RunSummary(
            run_id=self.run_id, episodes=self.state["episodes"], won=self.state["won"], errors=self.state["errors"],
            new_episodes=self.state["episodes"] - start_episodes, seconds=seconds, completion_tokens=tokens,
            tokens_per_s=tokens / gen_seconds if gen_seconds > 0 else 0.0,
            stopped_by_signal=self._stop_requested,
        )

    def _summary_line(self, started: float, start_episodes: int, start_tokens: int) -> None:
        s = self._summary(started, start_episodes, start_tokens)
        rate = s.new_episodes / s.seconds * 60 if s.seconds else 0.0
        msg = f"{s.episodes} episodes, success {s.success_rate:.1%}, {s.tokens_per_s:.1f} tok/s, {rate:.1f} ep/min"
        tqdm.write(msg)
        log.info(msg, extra={"fields": {"episodes": s.episodes, "success_rate": s.success_rate,
                                        "tokens_per_s": s.tokens_per_s, "episodes_per_min": rate}})

    def close(self) -> None:
        self.backend.close()
        self.store.close()
