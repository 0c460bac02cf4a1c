"""Run the loop of a config and SIGKILL this process at one named point (for tests/agent_runtime/run/test_phase_boundaries.py).

    python tests/scripts/kill_at.py CONFIG.json WORKDIR POINT

POINT: after-play (the commit of the 2nd episode, the cursor not moved yet), inside-extract (after the
first extraction is recorded), after-extract (EXTRACT returned), inside-consolidate (the first training
step's curve point written), after-consolidate (CONSOLIDATE returned). Exits 3 if the point was never reached.
"""

import json
import os
import signal
import sys
from pathlib import Path

from agent_runtime.config import config_from_dict
from agent_runtime.run.loop import AgentLoop
from agent_runtime.run.play import LocalExecutor
from memory import ExperienceStore


def kill_after(owner, name: str, calls: int = 1) -> None:
    original, count = getattr(owner, name), [0]

    def wrapped(*args, **kwargs):
        out = original(*args, **kwargs)
        count[0] += 1
        if count[0] == calls:
            os.kill(os.getpid(), signal.SIGKILL)
        return out

    setattr(owner, name, wrapped)


POINTS = {
    "after-play": (ExperienceStore, "add_episode", 2),
    "inside-extract": (ExperienceStore, "record_extraction", 1),
    "after-extract": (LocalExecutor, "extract", 1),
    "inside-consolidate": (ExperienceStore, "append_cycle_point", 1),
    "after-consolidate": (LocalExecutor, "consolidate", 1),
}

if __name__ == "__main__":
    config = config_from_dict(json.loads(Path(sys.argv[1]).read_text()))
    kill_after(*POINTS[sys.argv[3]])
    loop = AgentLoop(config, Path(sys.argv[2]), progress=False)
    loop.run()
    sys.exit(3)
