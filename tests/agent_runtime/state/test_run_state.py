"""The run's stored counters: a state an earlier version stored is read with the counters it lacked at 0, and what is
stored reads back the same."""

from agent_runtime.state import RunState


def test_state_reads_what_earlier_versions_stored():
    old = {"episodes": 3, "won": 1, "next_draw": 5, "open_draws": [3, 4]}
    state = RunState.from_stored(old)
    assert (state.episodes, state.won, state.next_draw, state.open_draws, state.cycles) == (3, 1, 5, [3, 4], 0)
    assert RunState.from_stored(state.stored()) == state and RunState.from_stored(None) == RunState()
