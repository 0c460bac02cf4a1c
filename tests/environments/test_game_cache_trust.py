"""What the shared game cache refuses to trust (`environments.game_cache`): a symlinked or
copied entry is never played, a tampered file is caught by the entry's manifest, an entry without a manifest
(an older version's) is rebuilt, a lock path that is a symlink is never followed, a cache another user can
write is refused with an error, and a lock somebody else holds ends in a timeout error or, on SIGTERM, in a
prompt exit.

Builds here are cheap fakes (one call writes a few bytes that say which game they are); the one TextWorld test
uses level-1 coin-collector games (about a second each).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import environments
from environments.game_cache import CacheLockTimeout, GameCacheError, UntrustedCacheError, cached_entry
from tests import ROOT

FILES = ("game.z8", "game.json")
REPO = ROOT


def _inputs(level: int) -> dict:
    return {"challenge": "coin", "level": level}


def _build_level(level: int):
    def build(folder: Path) -> None:
        (folder / "game.z8").write_text(f"a level-{level} game")
        (folder / "game.json").write_text(json.dumps({"level": level}))

    return build


def _entry(root: Path, key: str, level: int, **kwargs) -> Path:
    return cached_entry(root, key, FILES, _build_level(level), inputs=_inputs(level), **kwargs)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def cache(tmp_path) -> Path:
    """A cache holding a level-25 entry ("hard") and a level-1 entry ("easy")."""
    root = tmp_path / "cache"
    _entry(root, "hard", 25)
    _entry(root, "easy", 1)
    return root


def test_an_entry_holds_a_manifest_of_its_files_and_the_inputs_of_its_key(cache):
    manifest = json.loads((cache / "hard" / "manifest.json").read_text())
    assert manifest["key"] == "hard" and manifest["inputs"] == _inputs(25)
    assert manifest["files"] == {
        name: {"sha256": _sha(cache / "hard" / name), "size": (cache / "hard" / name).stat().st_size} for name in FILES
    }
    assert (cache / ".locks").stat().st_mode & 0o777 == 0o700  # only its owner can take a lock
    assert (cache / ".locks" / "hard").stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("plant", ["symlinked entry", "symlinked file", "copied entry"])
def test_a_planted_entry_is_rebuilt_never_played(cache, plant):
    built = _sha(cache / "hard" / "game.z8")
    shutil.rmtree(cache / "hard")
    if plant == "symlinked entry":
        (cache / "hard").symlink_to(cache / "easy")
    elif plant == "copied entry":  # real files of ours, but the manifest says they are another key's game
        shutil.copytree(cache / "easy", cache / "hard")
    else:
        (cache / "hard").mkdir()
        for name in FILES:
            (cache / "hard" / name).symlink_to(cache / "easy" / name)
    folder = _entry(cache, "hard", 25)
    assert folder == cache / "hard" and not folder.is_symlink()
    assert not any(path.is_symlink() for path in folder.iterdir())
    assert _sha(folder / "game.z8") == built  # the level-25 game, not the planted level-1 one
    assert (cache / "easy" / "game.z8").read_text() == "a level-1 game"  # the link's target is left as it was


def test_a_tampered_game_file_is_caught_by_the_manifest(cache):
    built = _sha(cache / "hard" / "game.z8")
    (cache / "hard" / "game.z8").write_text("a level-1 game!")  # same size, other bytes
    assert _sha(_entry(cache, "hard", 25) / "game.z8") == built
    (cache / "hard" / "game.z8").write_text("a level-25 game, and then some")  # another size
    assert _sha(_entry(cache, "hard", 25) / "game.z8") == built
    (cache / "hard" / "notes.txt").write_text("not the builder's")  # a file the manifest does not list
    assert sorted(p.name for p in _entry(cache, "hard", 25).iterdir()) == ["game.json", "game.z8", "manifest.json"]


def test_an_entry_without_a_manifest_is_rebuilt(tmp_path):
    root = tmp_path / "cache"
    (root / "hard").mkdir(parents=True)  # an older version's entry: both files, non-empty, no manifest
    (root / "hard" / "game.z8").write_text("a level-1 game")
    (root / "hard" / "game.json").write_text("{}")
    folder = _entry(root, "hard", 25)
    assert (folder / "game.z8").read_text() == "a level-25 game" and (folder / "manifest.json").is_file()


def test_a_symlink_at_the_lock_path_is_not_followed(tmp_path):
    root, target = tmp_path / "cache", tmp_path / "elsewhere" / "planted"
    target.parent.mkdir()
    (root / ".locks").mkdir(parents=True)
    (root / ".locks" / "hard").symlink_to(target)
    with pytest.raises(UntrustedCacheError, match=r"\.locks/hard is a symlink"):
        _entry(root, "hard", 25)
    assert not target.exists() and not (root / "hard").exists()


def test_a_cache_other_users_can_write_is_refused(cache):
    built = (cache / "hard" / "game.z8").read_bytes()
    for folder in (cache, cache / "hard"):
        for mode in (0o777, 0o775):
            folder.chmod(mode)
            with pytest.raises(
                UntrustedCacheError, match=rf"{folder} is writable by other users .*chmod go-w {folder}"
            ):
                _entry(cache, "hard", 25)
            folder.chmod(0o755)
    (cache / "hard" / "game.z8").chmod(0o666)
    with pytest.raises(UntrustedCacheError, match=r"hard/game.z8 is writable by other users"):
        _entry(cache, "hard", 25)
    (cache / "hard" / "game.z8").chmod(0o644)
    assert (cache / "hard" / "game.z8").read_bytes() == built  # refused, and nothing stored was lost


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
def test_a_cache_owned_by_another_user_is_refused(cache):
    for path in (cache, cache / "hard", cache / "hard" / "game.json"):
        os.chown(path, 4242, -1)
        with pytest.raises(UntrustedCacheError, match=rf"{path} belongs to uid 4242, not to you \(uid 0\)"):
            _entry(cache, "hard", 25)
        os.chown(path, 0, -1)
    assert (cache / "hard" / "game.z8").read_text() == "a level-25 game"


def test_a_build_that_writes_a_symlink_is_refused(tmp_path):
    def build(folder: Path) -> None:
        _build_level(1)(folder)
        (folder / "extra").symlink_to("/etc/passwd")

    with pytest.raises(UntrustedCacheError, match="extra, which is not a regular file"):
        cached_entry(tmp_path / "cache", "k", FILES, build, inputs={})
    assert not (tmp_path / "cache" / "k").exists()


def test_an_entry_built_under_a_group_writable_umask_is_still_ours(tmp_path):
    previous = os.umask(0o002)  # the default umask on many Linux systems
    try:
        folder = _entry(tmp_path / "cache", "hard", 25)
    finally:
        os.umask(previous)
    assert _entry(tmp_path / "cache", "hard", 25) == folder
    assert all(not path.stat().st_mode & 0o022 for path in (tmp_path / "cache", folder, *folder.iterdir()))


_WAITER = """
import signal, sys, time
from pathlib import Path
from environments.game_cache import cached_entry

stops = []
signal.signal(signal.SIGTERM, lambda *_: stops.append(1))  # what the run loop does: note the stop, go on
print("asking", flush=True)
cached_entry(Path(sys.argv[1]), "hard", ("game.z8",), lambda f: (f / "game.z8").write_text("x"), inputs={})
print("built", flush=True)
"""


def _hold_lock(root: Path):
    (root / ".locks").mkdir(parents=True, mode=0o700)
    handle = open(root / ".locks" / "hard", "w")  # noqa: SIM115 - held until the test closes it
    fcntl.flock(handle, fcntl.LOCK_EX)
    return handle


def _waiter(root: Path, timeout: str) -> subprocess.Popen:
    env = {**os.environ, "AGENT_RUNTIME_CACHE_LOCK_TIMEOUT": timeout, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen(
        [sys.executable, "-c", _WAITER, str(root)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    assert child.stdout.readline() == "asking\n"
    return child


def test_a_lock_held_elsewhere_times_out_with_an_error_naming_it(tmp_path):
    root = tmp_path / "cache"
    handle = _hold_lock(root)
    try:
        child = _waiter(root, "1")
        try:
            _, err = child.communicate(timeout=30)
        finally:
            child.kill()
    finally:
        handle.close()
    assert child.returncode == 1
    assert CacheLockTimeout.__name__ in err and f"{root}/.locks/hard" in err and f"pid {os.getpid()}" in err
    assert "AGENT_RUNTIME_CACHE_LOCK_TIMEOUT" in err
    assert not (root / "hard").exists()
    assert (root / ".locks" / "hard").stat().st_mode & 0o777 == 0o600  # an older version's 0o644 lock, closed


def test_sigterm_ends_a_wait_for_the_lock_promptly(tmp_path):
    root = tmp_path / "cache"
    handle = _hold_lock(root)
    try:
        child = _waiter(root, "600")
        time.sleep(1.0)  # the child is in its wait
        child.send_signal(signal.SIGTERM)
        started = time.monotonic()
        try:
            out, _ = child.communicate(timeout=10)
        finally:
            child.kill()
        waited = time.monotonic() - started
    finally:
        handle.close()
    assert child.returncode == 128 + signal.SIGTERM and waited < 2.0
    assert "built" not in out and not (root / "hard").exists()


@pytest.mark.slow
def test_a_symlinked_textworld_eval_game_is_never_played(tmp_path):
    """The review's attack: eval entries replaced by links to an easier game were played, and won."""
    env = environments.make("textworld/coin_collector", level=1, cache_dir=tmp_path, n_train=1, n_eval=1)
    try:
        train, evaluation = env.game_file("train-0"), env.game_file("eval-0")
        first_observation = env.reset(task_id="eval-0")[0]
        env.close()
        shutil.rmtree(evaluation.parent)
        evaluation.parent.symlink_to(train.parent)
        played = env.game_file("eval-0")
        assert played == evaluation and not played.parent.is_symlink()
        manifest = json.loads((played.parent / "manifest.json").read_text())
        assert manifest["inputs"]["seed"] == 1_000_000 and manifest["key"] == env.game_key("eval-0")
        assert _sha(played) == manifest["files"]["game.z8"]["sha256"] != _sha(train)
        assert env.reset(task_id="eval-0")[0] == first_observation
    finally:
        env.close()


@pytest.mark.slow
def test_an_old_workdirs_flat_game_is_read_only_when_it_is_a_plain_file_of_ours(tmp_path):
    built = environments.make("textworld/coin_collector", level=1, cache_dir=tmp_path / "mine", n_train=1, n_eval=1)
    source = built.game_file("train-0")
    legacy = tmp_path / "old" / "games"
    env = environments.make("textworld/coin_collector", level=1, cache_dir=legacy, n_train=1, n_eval=1)
    key = env.game_key("train-0")
    (legacy / "textworld").mkdir(parents=True)
    for suffix in ("z8", "json"):
        (legacy / "textworld" / f"{key}.{suffix}").symlink_to(source.with_suffix(f".{suffix}"))
    assert env.game_file("train-0") == legacy / "textworld" / key / "game.z8"  # the links are not followed


@pytest.mark.parametrize("raw", ["soon", "0", "-5", "nan"])
def test_a_lock_timeout_that_is_no_number_of_seconds_is_refused(tmp_path, monkeypatch, raw):
    monkeypatch.setenv("AGENT_RUNTIME_CACHE_LOCK_TIMEOUT", raw)
    with pytest.raises(GameCacheError, match=rf"={raw!r} is not .* accepted: a positive number of seconds"):
        _entry(tmp_path / "cache", "hard", 25)


def _has_open(pid: int, path: Path) -> bool:
    try:
        return any(os.readlink(link) == str(path) for link in Path(f"/proc/{pid}/fd").iterdir())
    except OSError:  # a descriptor closed while listing
        return False


@pytest.mark.slow
def test_a_run_waiting_for_a_game_stops_on_sigterm_with_its_draw_left_open(tmp_path):
    """The review's run: another process held the game's lock, and the run played nothing and ignored SIGTERM."""
    from memory import ExperienceStore

    games, workdir = tmp_path / "games", tmp_path / "run"
    env = environments.make("textworld/coin_collector", level=1, n_train=1, cache_dir=games)
    lock = games / "textworld" / ".locks" / env.game_key("train-0")
    lock.parent.mkdir(parents=True, mode=0o700)
    with open(lock, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        run = subprocess.Popen(
            [sys.executable, "-m", "agent_runtime", "run", "configs/smoke.yaml", "--workdir", str(workdir)]
            + ["--episodes", "2", "--no-progress", "--set", "envs.0.weight=1000000"]
            + ["--set", f"envs.0.kwargs.cache_dir={games}", "--set", "envs.0.kwargs.n_train=1"],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},  # this checkout's code, whatever is installed
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 120
            while not _has_open(run.pid, lock) and run.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            assert run.poll() is None, run.communicate()
            time.sleep(0.5)  # past the first try, into the wait
            run.send_signal(signal.SIGTERM)
            started = time.monotonic()
            _, err = run.communicate(timeout=30)
            stopped_after = time.monotonic() - started
        finally:
            run.kill()
    assert run.returncode == 128 + signal.SIGTERM and stopped_after < 5.0, err
    assert f"waiting for the game cache lock {lock}" in err
    with ExperienceStore.open(workdir, read_only=True) as store:
        [row] = store.runs()
    assert row.status == "stopped"  # no episode counted as failed; the draw is replayed on resume
    assert row.state["episodes"] == row.state["errors"] == 0 and row.state["open_draws"] == [0]
