"""The test suite: one folder per package and room of the code (tests/agent_runtime/run/ tests agent_runtime/run/),
the cross-cutting checks (the import floors, lint) at the top. `ROOT` is the repository, `TESTS` this folder (its
data/ and scripts/ are shared by the rooms' tests)."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def stop_process(pid: int, within: float = 10.0) -> None:
    """SIGSTOP `pid` and return once every thread of it has stopped. The kernel stops a process's threads one by one,
    each as it next runs, so a thread woken by a request sent right after `kill()` returns can still answer it: a JVM
    on a loaded machine did, and a test of the hung-server timeout saw no timeout."""
    import os
    import signal
    import time

    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + within
    while True:
        states = []
        for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
            try:
                states.append(stat.read_text().rsplit(")", 1)[1].split()[0])
            except (OSError, IndexError):
                continue  # a thread that ended meanwhile
        if states and all(state in ("T", "t") for state in states):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"process {pid} not stopped within {within} s (thread states {states})")
        time.sleep(0.01)
