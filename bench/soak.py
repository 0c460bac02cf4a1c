"""The soak: the whole loop killed with SIGKILL at random moments, resumed each time, then run on.

    nice -n 10 .venv/bin/python bench/soak.py --kills 100 --run-on 1000 [--memory-url URL] [--results bench/RESULTS.md]

Why: the loop promises that `kill -9` at any moment followed by `run --resume` loses at most the episodes in
flight and never does a phase twice (docs/architecture.md, "The run's state machine"). The unit tests kill at
chosen points (tests/agent_runtime/run/test_resume.py, tests/agent_runtime/run/test_phase_boundaries.py); only many kills at moments nobody chose
find the windows between those points, and only thousands of episodes in one store show whether memory, time
per episode and storage stay flat as the store grows.

What runs: `agent-runtime run CONFIG [--resume]` as a subprocess (OMP_NUM_THREADS=1: on shared cores torch's
thread pool costs 5x), on the tiny model built in code (`agent_runtime.testing`) acting in choice mode on
TextWorld coin-collector, with real EXTRACT phases (curation under a per-pool token budget, two pools, the
validation gate playing held-out episodes), the extractions written by `SoakLessonWriter` below (a LangChain
chat model whose items are a deterministic function of the trajectory, so curation sees varied lessons), and
real OPCD cycles (LoRA training, evaluation, promotion or rollback). Each session's kill is drawn from a seeded
generator: at a random delay after the start, or shortly after the cursor moves or a cycle starts (so
boundaries and cycles are hit often). After each kill nothing of the session may survive, and the draws are
checked; after the last kill the run goes on, uninterrupted, for `--run-on` episodes, and everything is checked
(bench/soak_checks.py). The timings depend on the machine, so a seed repeats the kill plan, not the exact moments.
The table it prints and appends to RESULTS is built in bench/soak_report.py.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage
from langchain_core.outputs import ChatGeneration, ChatResult

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script (bench/ first on the path): the root makes `bench` importable
from bench.soak_checks import budget_violations, draw_violations, phase_record, phase_violations
from bench.soak_report import append_results, db_table, phase_seconds, rates, rss_table, table
from bench.soak_session import Session

WRITER = "bench.soak:SoakLessonWriter"  # importable by the loop: it runs with the repository root on its path
TAG = "AGENT_RUNTIME_SOAK_TAG"  # set in every process of a session, to find survivors after a kill
INIT_STD = 0.2  # the tiny model's weight spread (see `prepare`)

_ADJ = ["dark", "narrow", "dusty", "bright", "cold", "quiet", "small", "wide", "damp", "old"]
_PLACE = ["kitchen", "cellar", "pantry", "attic", "corridor", "garden", "bedroom", "study", "chapel", "vault"]
_THING = ["coin", "key", "lamp", "chest", "door", "table", "shelf", "rug", "box", "book"]
_VERB = ["examine", "take", "open", "check", "search", "read", "move", "push", "inspect", "lift"]
_WAY = ["north", "south", "east", "west", "upstairs", "outside", "back", "onward"]


class SoakLessonWriter(BaseChatModel):
    """An extractor whose one or two items depend on the prompt only: the same trajectory and lessons always
    give the same items (an EXTRACT re-run after a kill writes what the killed one would have), and different
    trajectories give different items, so curation adds, merges and cuts to the budget."""

    @property
    def _llm_type(self) -> str:
        return "soak-lesson-writer"

    def _generate(self, messages, stop=None, run_manager=None, **kwargs) -> ChatResult:
        digest = hashlib.sha256("\n".join(str(m.content) for m in messages).encode()).digest()
        items = []
        for k in range(1 + digest[0] % 2):
            b = digest[1 + 5 * k : 6 + 5 * k]
            items.append(
                f"- EXPERIENCE ITEM: In a {_ADJ[b[0] % 10]} {_PLACE[b[1] % 10]} with a {_THING[b[2] % 10]}, "
                f"{_VERB[b[3] % 10]} it before going {_WAY[b[4] % 8]}."
            )
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content="\n".join(items)))])


@dataclass(frozen=True)
class Settings:
    """One soak's knobs (the command line's, also used by tests/bench/test_soak.py)."""

    workdir: Path
    model_dir: Path
    games_dir: Path
    kills: int = 100
    run_on: int = 1000
    seed: int = 0
    memory_url: str | None = None
    extract_every: int = 100
    consolidate_every: int = 300
    cycle_steps: int = 4
    cycle_lr: float = 1e-3
    gate_episodes: int = 2
    budget_tokens: int = 96
    pools: int = 2
    slots: int = 8
    train_tasks: int = 16
    min_delay: float = 2.0
    max_delay: float = 30.0
    phase_kills: float = 0.3  # share of sessions killed just after a cursor move or a cycle start
    phase_grace: float = 4.0  # such a kill comes within this many seconds of it
    final_timeout: float = 3600.0

    @property
    def name(self) -> str:
        return f"soak-{self.seed}"


def soak_config(s: Settings) -> dict:
    """The run config: fast acting (a tiny model choosing among admissible actions), every phase real."""
    return {
        "name": s.name,
        "seed": s.seed,
        "model": {"name": str(s.model_dir), "dtype": "float32", "max_new_tokens": 4},
        "envs": [
            {
                "id": "textworld/coin_collector",
                "max_steps": 3,
                "kwargs": {"level": 1, "n_train": s.train_tasks, "n_eval": 4, "cache_dir": str(s.games_dir)},
            }
        ],
        "runtime": {"slots": s.slots, "summary_every": 100},
        "lessons": {
            "enabled": True,
            "extract_every": s.extract_every,
            "recent_episodes": 4,
            "extractor": WRITER,
            "embedder": "hash",
            "pools": s.pools,
            "budget_tokens": s.budget_tokens,
            "gate_episodes": s.gate_episodes,
        },
        "evaluation": {"episodes_per_env": 2},
        # min_kl_drop 0: promote any cycle that did not raise the held-out KL, so that both outcomes (and acting
        # with a promoted adapter, and cycles on top of it) happen on a random tiny model
        "opcd": {
            "enabled": True,
            "consolidate_every": s.consolidate_every,
            "recent_episodes": 16,
            "max_prompts": 32,
            "min_kl_drop": 0.0,
            "trainer": {
                "steps": s.cycle_steps,
                "batch_size": 2,
                "max_new_tokens": 6,
                "lr": s.cycle_lr,
                "k": 16,
                "lora_r": 4,
                "sampler": "live",
            },
        },
        "memory": {"embedder": "hash", **({"url": s.memory_url} if s.memory_url else {})},
    }


# -- watching a session from outside --------------------------------------------------------------------
def proc_kb(pid: int, key: str) -> int | None:
    """A `/proc/<pid>/status` field in kB (VmRSS: resident now, VmHWM: the peak), None once it is gone."""
    return proc_fields(pid, key).get(key)


def proc_fields(pid: int, *keys: str) -> dict[str, int]:
    """`/proc/<pid>/status` fields (in kB, or a count), read at one moment; those it lacks (the process gone) are left out."""
    out: dict[str, int] = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in keys:
                out[key] = int(value.split()[0])
    except (OSError, ValueError, IndexError):
        return {}
    return out


def tagged_pids(tag: str) -> list[int]:
    """Processes whose environment carries this session's tag (the loop and everything it started)."""
    needle, out = f"{TAG}={tag}".encode(), []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    out.append(int(entry.name))
            except OSError:
                continue
    return out


class Probe:
    """The run's cursor as a second reader sees it while the loop writes: one short read-only query."""

    def __init__(self, s: Settings):
        from sqlalchemy import create_engine

        self.name, self.db = s.name, s.workdir / "memory.db"
        url = s.memory_url or f"sqlite:///file:{self.db}?mode=ro&uri=true"
        self.engine = create_engine(url, pool_pre_ping=True)

    def read(self) -> dict | None:
        from sqlalchemy import text
        from sqlalchemy.exc import SQLAlchemyError

        if self.engine.dialect.name == "sqlite" and not self.db.exists():
            return None
        try:
            with self.engine.connect() as conn:
                row = conn.execute(text("SELECT id, phase, state FROM runs WHERE name = :n"), {"n": self.name}).first()
                if row is None:
                    return None
                cycle = conn.execute(text("SELECT max(id) FROM opcd_cycles WHERE run_id = :r"), {"r": row[0]}).scalar()
        except SQLAlchemyError:  # the schema is being created, or the database is busy: ask again later
            return None
        state = json.loads(row[2]) if isinstance(row[2], str) else dict(row[2] or {})
        return {"phase": row[1], "episodes": state.get("episodes", 0), "cycle": cycle}

    def close(self) -> None:
        self.engine.dispose()


def database_bytes(s: Settings) -> int:
    """The store's size: the SQLite file and its write-ahead log, or PostgreSQL's `pg_database_size`."""
    if s.memory_url is None:
        return sum(p.stat().st_size for p in (s.workdir / "memory.db", s.workdir / "memory.db-wal") if p.exists())
    from sqlalchemy import create_engine, text

    engine = create_engine(s.memory_url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(text("SELECT pg_database_size(current_database())")).scalar())
    finally:
        engine.dispose()


# -- the soak -------------------------------------------------------------------------------------------
class Soak:
    def __init__(self, s: Settings):
        self.s = s
        self.rng = random.Random(s.seed)
        s.workdir.mkdir(parents=True, exist_ok=True)
        self.config_path = s.workdir / "soak.yaml"
        self.config = soak_config(s)
        self.config_path.write_text(json.dumps(self.config, indent=1))  # JSON is YAML
        self.tmp = s.workdir / "tmp"  # the sessions' TMPDIR: what a killed session leaves there is counted
        self.tmp.mkdir(exist_ok=True)
        self.log = s.workdir / "sessions.log"
        self.sessions: list[Session] = []
        self.probe = Probe(s)

    @contextmanager
    def _opened(self):
        """The store (read-only) and the soak's run; the run is None before a session has created it."""
        from memory import DatabaseOutdatedError, ExperienceStore, StoreUnavailableError

        try:
            store = ExperienceStore.open(self.s.memory_url or self.s.workdir, read_only=True)
        except (StoreUnavailableError, DatabaseOutdatedError):  # no database, or no schema yet: killed starting
            yield None, None
            return
        try:
            yield store, store.find_run(self.s.name)
        finally:
            store.close()

    def _committed(self) -> tuple[bool, int]:
        with self._opened() as (_, run):
            return run is not None, (run.state.get("episodes", 0) if run else 0)

    def run(self) -> dict:
        started = time.monotonic()
        try:
            for i in range(self.s.kills):
                timed = self.rng.random() >= self.s.phase_kills
                delay = (
                    self.rng.uniform(self.s.min_delay, self.s.max_delay)
                    if timed
                    else self.rng.uniform(0.0, self.s.phase_grace)
                )
                session = self._session(i, "timer" if timed else "phase", delay, None)
                if session.violations:
                    break
            else:
                _, done = self._committed()
                self._session(self.s.kills, "final", 0.0, done + self.s.run_on)
        finally:
            self.probe.close()
        return self.report(time.monotonic() - started)

    def _session(self, index: int, kind: str, delay: float, target: int | None) -> Session:
        exists, done = self._committed()
        session = Session(index, kind, delay, resumed=exists, start_episodes=done)
        tag = uuid.uuid4().hex
        cmd = [
            sys.executable,
            "-m",
            "agent_runtime",
            "run",
            str(self.config_path),
            "--workdir",
            str(self.s.workdir),
            "--no-progress",
            "--episodes",
            str(target or 10**9),
            *(["--resume"] if session.resumed else []),
        ]
        env = {
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "TMPDIR": str(self.tmp),
            TAG: tag,
            "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
        }
        with self.log.open("a") as log:
            log.write(f"\n=== session {index} ({kind}, delay {delay:.1f}s): {' '.join(cmd)}\n")
            log.flush()
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
            try:
                self._watch(proc, session, target is None, tag)
            finally:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
        session.returncode = proc.returncode
        deadline = time.monotonic() + 5
        while (alive := tagged_pids(tag)) and time.monotonic() < deadline:
            time.sleep(0.2)
        session.survivors = len(alive)
        for pid in alive:  # reported above; not left to run on
            os.kill(pid, signal.SIGKILL)
        session.violations += [f"{session.survivors} processes of the session outlived it"] if alive else []
        if not session.killed and proc.returncode != 0:
            session.violations.append(f"the session exited {proc.returncode} (see {self.log})")
        self._check(session)
        self.sessions.append(session)
        ending = f"killed in {session.phase_at_kill}" if session.killed else f"exit {proc.returncode}"
        problems = "; " + "; ".join(session.violations) if session.violations else ""
        print(
            f"session {index:3d} {kind:6s} {session.start_episodes:6d} -> {session.end_episodes:6d} episodes, "
            f"{session.seconds:5.1f}s, {ending}, peak RSS {session.peak_rss_kb / 1024:.0f} MiB{problems}",
            flush=True,
        )
        return session

    def _watch(self, proc: subprocess.Popen, session: Session, kill: bool, tag: str) -> None:
        t0, kill_at, first, last, polled, tree_at = time.monotonic(), None, None, None, 0.0, 0.0
        if kill and session.kind == "timer":
            kill_at = session.delay
        while proc.poll() is None:
            t = time.monotonic() - t0
            if t - polled >= 0.3:
                polled, view = t, self.probe.read()
                if view is not None:
                    first, last = first or view, view
                    moved = first["phase"] != view["phase"] or (view["cycle"] or 0) > (first["cycle"] or 0)
                    if kill and kill_at is None and moved:
                        kill_at = t + session.delay
                rss = proc_kb(proc.pid, "VmRSS")
                if rss is not None:
                    session.rss.append((round(t, 1), rss, last["episodes"] if last else session.start_episodes))
                if not kill and t - tree_at >= 10:  # the game processes and the fork server beside the loop
                    tree_at = t
                    session.tree_rss.append(
                        (round(t, 1), sum(proc_kb(p, "VmRSS") or 0 for p in tagged_pids(tag)), len(tagged_pids(tag)))
                    )
            if kill and kill_at is None and t > 3 * self.s.max_delay:
                kill_at = t  # no move seen (a long PLAY): kill anyway
            if kill_at is not None and t >= kill_at:
                session.peak_rss_kb = proc_kb(proc.pid, "VmHWM") or 0
                os.kill(proc.pid, signal.SIGKILL)
                session.killed = True
                break
            if not kill and t > self.s.final_timeout:
                session.violations.append(f"the final session did not finish within {self.s.final_timeout:.0f}s")
                break
            time.sleep(0.1)
        session.seconds = time.monotonic() - t0
        session.peak_rss_kb = session.peak_rss_kb or max((r for _, r, _ in session.rss), default=0)

    def _check(self, session: Session) -> None:
        """After every session: the draws and counters; the cursor it was killed in; the store's size."""
        with self._opened() as (store, run):
            if run is None:
                session.phase_at_kill = "start-up"
                return
            session.end_episodes = run.state.get("episodes", 0)
            running = store.cycles(run.id, status="running")
            session.running_cycles = [c.id for c in running]
            if len(running) > 1:
                session.violations.append(f"more than one cycle running: {session.running_cycles}")
            before = set(self.sessions[-1].running_cycles) if self.sessions else set()
            if session.killed:  # a cycle left by an earlier kill is rolled back only once CONSOLIDATE starts again
                new = set(session.running_cycles) - before
                session.phase_at_kill = run.phase + (
                    " (cycle running)" if new else " (before the interrupted cycle's rollback)" if running else ""
                )
            elif running:
                session.violations.append(f"cycles left running after a clean exit: {[c.id for c in running]}")
            session.violations += draw_violations(store, run)
        session.db_bytes = database_bytes(self.s)

    # -- the report ------------------------------------------------------------------------------------
    def report(self, seconds: float) -> dict:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(self.s.model_dir))

        def count(text: str) -> int:  # as the loop counts the budget (`lessons_phase.text_token_counter`)
            return len(tokenizer(text, add_special_tokens=False)["input_ids"])

        with self._opened() as (store, run):
            record = phase_record(store, run.id)
            final = self.sessions[-1]
            violations = [f"session {x.index}: {v}" for x in self.sessions for v in x.violations]
            if final.kind == "final" and not final.violations:
                if run.status != "finished" or run.state.get("open_draws"):
                    violations.append(f"the run ended {run.status} with open draws {run.state.get('open_draws')}")
                violations += phase_violations(store, run, self.config, record)
                violations += budget_violations(store, run.id, count, self.s.budget_tokens)
            elif final.kind != "final":
                violations.append("stopped before the final session (see the violations above)")
            cycles = [c for _, c in record["cycles"]]
            steps = sum(e.num_steps for e in record["episodes"])
            lesson_sets = store.lesson_sets(run.id)
        killed = [x for x in self.sessions if x.killed]
        n = len(record["episodes"])
        interrupted = sum((c.error or "").startswith("interrupted") for c in cycles)
        left_running = len({i for x in killed for i in x.running_cycles})  # a kill at start-up finds the last one's
        if interrupted != left_running:
            violations.append(f"{interrupted} cycles marked interrupted, but kills left {left_running} running")
        gaps = (
            {x.start_episodes for x in self.sessions}
            | set(record["extraction_rows"])
            | {p for p in range(self.s.consolidate_every, n + 1, self.s.consolidate_every)}
        )
        window = min(1000, n // 2)
        return {
            "settings": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self.s).items()},
            "seconds": round(seconds, 1),
            "kills": len(killed),
            "episodes": n,
            "steps": steps,
            "episodes_under_kills": final.start_episodes if final.kind == "final" else n,
            "kills_by_phase": dict(Counter(x.phase_at_kill or "?" for x in killed)),
            "extractions": len(record["extraction_rows"]),
            "lesson_sets": len(lesson_sets),
            "lesson_sets_live": sum(v.status == "live" for v in lesson_sets),
            "cycles": dict(
                Counter("interrupted" if (c.error or "").startswith("interrupted") else c.status for c in cycles)
            ),
            "window": window,
            "phase_seconds": phase_seconds(record, {x.start_episodes for x in self.sessions[1:]}),
            "first": rates(record["episodes"][:window], gaps, 0),
            "last": rates(record["episodes"][n - window :], gaps, n - window),
            "rss": rss_table(self.sessions),
            "db": db_table(self.sessions, self.s.memory_url is None),
            "survivors": sum(x.survivors for x in self.sessions),
            "game_dirs_left": len(list(self.tmp.glob("agent-runtime-game-*"))),
            "violations": violations,
        }


def prepare(s: Settings, init_std: float = INIT_STD) -> None:
    """The tiny model and the game cache (both kept between soaks). The model's weights are drawn with a
    larger spread than the usual 0.02, so that lessons in context change its choices (held-out KL ~0.2 rather
    than ~1e-5, which is float noise): a cycle can then lower that KL measurably, and cycles get promoted."""
    if not (s.model_dir / "config.json").exists():
        import torch

        from agent_runtime.testing import tiny_model_and_tokenizer

        model, tokenizer = tiny_model_and_tokenizer()
        model.config.initializer_range = init_std
        torch.manual_seed(0)
        model.apply(model._init_weights)
        model.save_pretrained(s.model_dir)
        tokenizer.save_pretrained(s.model_dir)
    s.games_dir.mkdir(parents=True, exist_ok=True)


def main(argv: list[str] | None = None) -> int:
    cache = Path(os.environ.get("AGENT_RUNTIME_CACHE", Path.home() / ".cache" / "agent-runtime")) / "soak"
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kills", type=int, default=100)
    p.add_argument("--run-on", type=int, default=1000, help="episodes played after the last kill, uninterrupted")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", type=Path, help="default: a temporary directory, removed afterwards")
    p.add_argument("--memory-url", help="an EMPTY PostgreSQL database (its whole size is measured)")
    p.add_argument("--extract-every", type=int, default=100)
    p.add_argument("--consolidate-every", type=int, default=300)
    p.add_argument("--cycle-steps", type=int, default=4)
    p.add_argument("--cycle-lr", type=float, default=1e-3)
    p.add_argument("--min-delay", type=float, default=2.0)
    p.add_argument("--max-delay", type=float, default=30.0)
    p.add_argument("--phase-kills", type=float, default=0.3)
    p.add_argument("--json", type=Path, help="write the whole report here")
    p.add_argument("--results", type=Path, help="append the table to this file (bench/RESULTS.md)")
    args = p.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="agent-runtime-soak-"))
    s = Settings(
        workdir=workdir,
        model_dir=cache / f"tiny-std{INIT_STD}",
        games_dir=cache / "games",
        kills=args.kills,
        run_on=args.run_on,
        seed=args.seed,
        memory_url=args.memory_url,
        extract_every=args.extract_every,
        consolidate_every=args.consolidate_every,
        cycle_steps=args.cycle_steps,
        cycle_lr=args.cycle_lr,
        min_delay=args.min_delay,
        max_delay=args.max_delay,
        phase_kills=args.phase_kills,
    )
    prepare(s)
    try:
        report = Soak(s).run()
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    print(table(report))
    for v in report["violations"]:
        print(f"VIOLATION: {v}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=str))
    if args.results:
        append_results(
            args.results, report, "nice -n 10 .venv/bin/python bench/soak.py " + " ".join(argv or sys.argv[1:])
        )
    return 1 if report["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
