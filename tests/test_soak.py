"""What the soak (bench/soak.py) found, each as a focused test.

- A second store opened in a process took the first one's SQLite locks away (the header check closed a
  descriptor of its own on the file), so another process's last close deleted the WAL under the first store,
  whose reads then missed a running writer's commits (or failed as "malformed").
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from memory import ExperienceStore
from memory.testing import make_episode

ROOT = Path(__file__).resolve().parents[1]


_WRITER = """
import sys
from memory import ExperienceStore
from memory.testing import make_episode
store = ExperienceStore.open(sys.argv[1])
[run] = store.runs()
store.add_episode(run.id, make_episode())
print("written", flush=True)
if sys.argv[2] == "stay":
    sys.stdin.read()
store.close()
"""


def _write_elsewhere(workdir: Path, stay: bool) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(workdir), "stay" if stay else "close"], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "written\n"
    return proc


def test_a_second_store_in_a_process_leaves_the_first_one_seeing_a_live_writer(tmp_path):
    """The dashboard opens a second store for search; the soak's harness opens one per check. Either took the
    first store's SHARED lock away, and the next process to close its last connection deleted the WAL under
    it: the first store then missed the commits of the loop writing in another process."""
    with ExperienceStore.open(tmp_path) as store:
        store.add_episode(store.create_run("r", {}), make_episode())
    reader = ExperienceStore.open(tmp_path, read_only=True)
    try:
        assert reader.count_episodes() == 1  # its pooled connection holds SQLite's SHARED lock from here on
        ExperienceStore.open(tmp_path, read_only=True).close()
        _write_elsewhere(tmp_path, stay=False).wait()  # its last close checkpoints (and deletes the WAL if it can)
        loop = _write_elsewhere(tmp_path, stay=True)  # a writer still running, its commit in the WAL
        try:
            assert reader.count_episodes() == 3
        finally:
            loop.stdin.close()
            loop.wait()
    finally:
        reader.close()
