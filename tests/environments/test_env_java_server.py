"""The JVM's surroundings: the private folder a run killed with SIGKILL leaves behind is removed at the next start
(only when every owner has ended), and the gateway's jar is found by absolute path, whatever lies in the working
directory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import environments
from environments import java
from tests import ROOT

_GAME = """
import environments
env = environments.make("twx/coin")
env.reset(task_id="train-0")
print(env.server._dir, env.server.pid, flush=True)
input()
"""


def _ended_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _folder(root: Path, name: str, owners: list[str] | None) -> Path:
    folder = root / f"{java.FOLDER_PREFIX}{name}"
    folder.mkdir()
    (folder / "java-stderr.log").write_text("")
    if owners is not None:
        (folder / java.OWNERS_FILE).write_text("".join(f"{o}\n" for o in owners))
    return folder


def test_only_folders_whose_owners_all_ended_are_removed(tmp_path):
    me = java._identity(os.getpid())
    ended = f"{_ended_pid()}:1"
    killed = _folder(tmp_path, "killed", [ended, f"{_ended_pid()}:2"])
    half = _folder(tmp_path, "jvm-still-running", [ended, me])
    live = _folder(tmp_path, "live", [me])
    reused = _folder(tmp_path, "pid-reused", [f"{os.getpid()}:0"])  # our pid, but another start: its owner ended
    starting = _folder(tmp_path, "starting", None)  # no owners file yet: being created
    garbled = _folder(tmp_path, "garbled", ["not-a-pid"])
    target = _folder(tmp_path, "target", [ended])
    link = tmp_path / f"{java.FOLDER_PREFIX}link"
    link.symlink_to(target)
    other = tmp_path / "agent-runtime-game-x"  # another component's folder
    other.mkdir()
    (other / java.OWNERS_FILE).write_text(f"{ended}\n")

    removed = java.remove_orphaned_folders(tmp_path)

    assert sorted(removed) == sorted([killed, reused, target])
    assert not killed.exists() and not reused.exists() and not target.exists()
    assert half.is_dir() and live.is_dir() and starting.is_dir() and garbled.is_dir() and other.is_dir()
    assert link.is_symlink()


def test_a_running_jvm_folder_names_the_process_and_its_jvm(monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    env = environments.make("twx/coin")
    try:
        env.reset(task_id="train-0")
        folder = env.server._dir
        assert folder.parent == tmp_path and folder.name.startswith(java.FOLDER_PREFIX)
        owners = (folder / java.OWNERS_FILE).read_text().split()
        assert [o.split(":")[0] for o in owners] == [str(os.getpid()), str(env.server.pid)]
        assert java.remove_orphaned_folders(tmp_path) == [] and folder.is_dir()
    finally:
        env.close()
    assert not folder.exists()


@pytest.mark.slow
def test_the_folder_of_a_sigkilled_run_is_removed_at_the_next_start(monkeypatch, tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-c", _GAME],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    folder, jvm = proc.stdout.readline().split()
    folder = Path(folder)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    proc.stdin.close()
    deadline = time.monotonic() + 10
    while java._identity(int(jvm)) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert java._identity(int(jvm)) is None and folder.is_dir()  # the JVM went with its run; its folder stayed
    live = _folder(tmp_path, "another-run", [java._identity(os.getpid())])
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    env = environments.make("twx/coin")
    try:
        env.reset(task_id="train-0")
        assert not folder.exists() and live.is_dir() and env.server._dir.is_dir()
    finally:
        env.close()


def test_the_gateway_jar_is_found_by_absolute_path_whatever_the_working_directory_holds(monkeypatch, tmp_path):
    from py4j.version import __version__

    (tmp_path / f"py4j{__version__}.jar").write_bytes(b"not a jar")
    monkeypatch.chdir(tmp_path)
    env = environments.make("twx/coin")
    try:
        observation, info = env.reset(task_id="train-0")
        assert observation and info["admissible_actions"]
    finally:
        env.close()
    jar = Path(java.py4j_jar())
    assert jar.is_absolute() and jar.parent != tmp_path and jar.stat().st_size > 1000


def test_a_missing_gateway_jar_is_a_clear_error(monkeypatch, tmp_path):
    import py4j.version

    monkeypatch.setattr(py4j.version, "__version__", "0.0.0-missing")
    with pytest.raises(java.JavaServerError, match=r"Py4J's jar py4j0\.0\.0-missing\.jar was not found.*make install"):
        java.py4j_jar()
