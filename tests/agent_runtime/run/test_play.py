"""PLAY written once: the schedule of phases and stops, and the play session's commits.

A commit that fails leaves the state where it was and the draw open, so the counters never count an episode
that is not stored and a resumed run replays exactly that draw (the local loop and the Ray executor share the
session, so both are covered by it; the Ray path is run in tests/agent_runtime/run/test_ray.py). Backend capabilities are
checked once, with an error that names the backend.
"""

from __future__ import annotations

import pytest

from agent_runtime.config import config_from_dict
from agent_runtime.llm import backend_needs, make_backend
from agent_runtime.llm.base import AdapterBackend, BackendError, ChoiceBackend, activate, require
from agent_runtime.llm.scripted import ScriptedBackend
from agent_runtime.run.loop import AgentLoop
from agent_runtime.run.play import Schedule
from agent_runtime.state import RunState
from environments.base import EnvSpec, TextEnv
from memory import ExperienceStore


def make_config(games_dir, *, episodes=6, slots=2, memory_url=None, **extra):
    data = {
        "name": "t",
        "model": {"name": "scripted", "backend": "scripted"},
        "envs": [
            {
                "id": "textworld/coin_collector",
                "max_steps": 4,
                "kwargs": {"level": 1, "n_train": 4, "cache_dir": str(games_dir)},
            }
        ],
        "runtime": {"slots": slots, "episodes": episodes},
    }
    data.update(extra)
    if memory_url is not None:
        data["memory"] = {"url": memory_url}
    return config_from_dict(data)


def fail_commit(loop, n: int, exc: Exception) -> None:
    """Make the n-th `add_episode` of `loop`'s store raise `exc` (before anything is written)."""
    add_episode, count = loop.store.add_episode, {"n": 0}

    def wrapped(*args, **kwargs):
        count["n"] += 1
        if count["n"] == n:
            raise exc
        return add_episode(*args, **kwargs)

    loop.store.add_episode = wrapped


def test_schedule_is_the_one_place_phases_fall_due(games_dir):
    config = make_config(
        games_dir, episodes=20, lessons={"enabled": True, "extract_every": 4}, opcd={"consolidate_every": 8}
    )
    config.opcd.enabled = True
    schedule = Schedule(config)
    state = RunState(episodes=4)
    assert schedule.after_play(state) == "EXTRACT" and schedule.after_extract(state) == "PLAY"
    state.last_extract_at = 4
    assert schedule.after_play(state) is None
    assert schedule.may_draw(state, 7) and not schedule.may_draw(state, 8)  # counting the episodes in flight
    state.episodes, state.last_extract_at = 8, 8
    assert schedule.after_play(state) == "CONSOLIDATE"
    state.episodes, state.last_consolidate_at, state.open_draws = 20, 16, [19]
    assert not schedule.over(state), "a draw still open keeps the run going"
    state.open_draws = []
    assert schedule.over(state) and not schedule.may_draw(state, 20)
    assert Schedule(config, deadline=0.0).past_deadline()


@pytest.mark.slow
def test_a_failed_commit_leaves_the_state_and_the_draw_open(tmp_path, games_dir, memory_url):
    """The third commit fails: two episodes counted and stored, draw 2 open, and the resumed run replays it once."""
    config = make_config(games_dir, episodes=6, slots=1, memory_url=memory_url)
    loop = AgentLoop(config, tmp_path, progress=False)
    fail_commit(loop, 3, OSError("disk full"))
    with pytest.raises(OSError, match="disk full"):
        loop.run()
    loop.close()
    with ExperienceStore.open(memory_url) as store:
        [run] = store.runs()
        rows = sorted(e.metadata["draw"] for e in store.episodes(run.id))
        assert run.state["episodes"] == len(rows) == 2 and rows == [0, 1]
        assert run.state["open_draws"] == [2] and run.state["next_draw"] == 3 and run.status == "stopped"
    loop = AgentLoop(config, tmp_path, resume=True, progress=False)
    summary = loop.run()
    loop.close()
    assert summary.episodes == 6
    with ExperienceStore.open(memory_url) as store:
        assert sorted(e.metadata["draw"] for e in store.episodes(summary.run_id)) == list(range(6))


def test_capabilities_are_checked_with_the_backend_named():
    scripted = ScriptedBackend()
    assert require(scripted, ChoiceBackend, "choice mode") is scripted
    with pytest.raises(BackendError, match="opcd needs a backend that can act with LoRA adapters; the scripted"):
        require(scripted, AdapterBackend, "opcd")
    activate(scripted, None)  # the base model: what a backend without adapters already acts with

    class Adapter:
        name, path = "cycle-1", "/nowhere"

    with pytest.raises(BackendError, match="acting with adapter cycle-1 needs .* the scripted backend cannot"):
        activate(scripted, Adapter())


class WordsOnly:
    """A backend with the protocol's members only: it generates, it cannot choose among actions or use adapters."""

    name = "words-only"
    context_window = 4096

    def count_tokens(self, chat):
        return sum(len(m["content"].split()) for m in chat)

    def generate(self, prompts, params):
        raise AssertionError("a backend the run cannot use must never generate")

    def close(self):
        pass


def test_what_a_run_needs_of_a_backend_follows_its_config(games_dir):
    game = make_config(games_dir)
    assert [c for c, _ in backend_needs(game, ["text"])] == [ChoiceBackend], "auto mode chooses in a game"
    assert backend_needs(game, ["math"]) == [], "and answers math in free text"
    game.agent.action_mode = "free"
    game.opcd.enabled = True
    assert [c for c, _ in backend_needs(game, ["text"])] == [AdapterBackend]


def test_a_backend_the_run_cannot_use_fails_where_it_is_built_naming_what_it_lacks(tmp_path, games_dir):
    config = make_config(games_dir)
    config.opcd.enabled = True
    with pytest.raises(
        BackendError,
        match=r"opcd\.enabled \(an OPCD cycle .*\) needs a backend that can act with "
        r"LoRA adapters; the scripted backend cannot",
    ):
        make_backend(config.model, run=config)
    assert isinstance(make_backend(config.model), ScriptedBackend), "outside a run nothing is asked of it"

    with pytest.raises(
        BackendError,
        match=r"agent\.action_mode auto \(choice mode.*\) needs a backend that can "
        r"choose among admissible actions; the words-only backend cannot",
    ):
        AgentLoop(make_config(games_dir), tmp_path, backend=WordsOnly(), progress=False)
    assert not (tmp_path / "memory.db").exists(), "before the store is opened, let alone an episode played"


class NulEnv(TextEnv):
    """A plugin whose task ids, observations and actions carry NUL characters (PostgreSQL refuses them in text)."""

    spec = EnvSpec(id="tests/nul", max_steps=2, family="text")

    def __init__(self, cache_dir=None):
        pass

    def tasks(self, split):
        return [f"{split}\x00{i}" for i in range(3)]

    def reset(self, *, seed=None, task_id=None):
        return "a room\x00with a NUL", {"admissible_actions": ["wait\x00"], "goal": "win\x00"}

    def step(self, action):
        return "done\x00", 1.0, True, False, {"won": True, "admissible_actions": []}


def test_nul_characters_in_game_text_are_stored_on_every_backend(tmp_path, games_dir, memory_url):
    config = make_config(
        games_dir, episodes=3, memory_url=memory_url, envs=[{"id": "tests.agent_runtime.run.test_play:NulEnv"}]
    )
    loop = AgentLoop(config, tmp_path, progress=False)
    summary = loop.run()
    loop.close()
    with ExperienceStore.open(memory_url) as store:
        [run] = store.runs()
        episodes = store.episodes(run.id)
        assert summary.episodes == run.state["episodes"] == len(episodes) == 3
        episode = store.episode(episodes[0].id)
        step = episode.steps[0]
    assert step.observation == "a room\ufffdwith a NUL" and "\x00" not in step.prompt
    assert episode.task_id.startswith("train\ufffd") and step.admissible_actions == ["wait\ufffd"]


def test_a_requested_reconsolidation_runs_once_and_first(tmp_path, games_dir, tiny_model_dir, monkeypatch):
    """A re-consolidation asked for by `lessons forget` runs before PLAY, once: the request it carried out is not
    taken for a new one (the watch asks the store at most every 2 s, a cycle with nothing to distil takes less)."""
    from agent_runtime.run import play
    from distill.lessons.forget import RECONSOLIDATE

    cycles, run_cycle = [], play.run_cycle

    def counted(*args, finish=None, **kwargs):
        cycles.append(finish.requests_done)
        return run_cycle(*args, finish=finish, **kwargs)

    monkeypatch.setattr(play, "run_cycle", counted)
    config = make_config(
        games_dir,
        episodes=2,
        model={"name": str(tiny_model_dir), "max_new_tokens": 4},
        lessons={"enabled": True, "extract_every": 10_000},
        opcd={"enabled": True, "consolidate_every": 10_000},
    )
    loop = AgentLoop(config, tmp_path, progress=False)
    asked = loop.store.add_request(loop.run_id, RECONSOLIDATE, {"reason": "a test"})
    summary = loop.run()
    assert cycles == [(asked,)], "one cycle, carrying out the request"
    assert summary.episodes == 2 and loop.store.requests(loop.run_id, kind=RECONSOLIDATE, pending=True) == []
    loop.close()


def test_the_schedule_runs_a_requested_reconsolidation_first_even_at_the_target(games_dir):
    config = make_config(games_dir, episodes=4, lessons={"enabled": True}, opcd={"consolidate_every": 100})
    asked = {"now": True}
    state = RunState(episodes=4)
    assert Schedule(config, requested=lambda: asked["now"]).before_play() is None, "opcd is off: nothing runs"
    config.opcd.enabled = True
    schedule = Schedule(config, requested=lambda: asked["now"])
    assert schedule.over(state) and schedule.before_play() == "CONSOLIDATE"
    assert schedule.consolidate_due(state) and not schedule.may_draw(RunState(), 0)
    asked["now"] = False
    assert schedule.before_play() is None and not schedule.consolidate_due(state)
