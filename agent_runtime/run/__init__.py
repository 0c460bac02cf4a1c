"""The drivers of a run: the agent loop (`run.loop`), its PLAY executors (`run.play` in process, `run.ray_executor`
over a Ray cluster) and the run's names and resume state (`run.names`). What a run is (`Run`, its counters, cursor
and profile) lives one floor down in `agent_runtime.state`, where the phases read it too."""
