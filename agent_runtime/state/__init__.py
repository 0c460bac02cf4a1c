"""What one run is, below every phase and every driver: the `Run` (its config, workdir, store, id, held-out set and
environment pool: `state.run`), its stored counters (`RunState`, the run row's `state`: `state.run_state`), the
cursor move a phase applies in the transaction of its results (`state.cursor`), and the profile of where its time
and memory go (`state.profile`). The phases and the drivers (`agent_runtime.run`: the loop, its executors) import
these; this room imports neither."""

from agent_runtime.state.cursor import CursorMove
from agent_runtime.state.profile import profiled
from agent_runtime.state.run import Run
from agent_runtime.state.run_state import RunState

__all__ = ["CursorMove", "Run", "RunState", "profiled"]
