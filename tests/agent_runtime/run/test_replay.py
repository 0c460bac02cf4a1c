"""A run replays: killed anywhere and resumed, it plays the same episodes (task, seed, every response and action) as
the same run never killed, with the policy sampling at a temperature, in choice mode and in free text. Every draw of
PLAY is seeded by (run seed, draw index, turn), so what a slot samples depends neither on which slots share its
batch nor on how many calls came before (a resumed run starts with a fresh backend and other batches)."""

from __future__ import annotations

import pytest

from agent_runtime.config import config_from_dict
from agent_runtime.run.loop import AgentLoop
from memory import ExperienceStore


class Killed(RuntimeError):
    """The process died here: nothing after this commit was stored."""


def make_config(games_dir, model: dict, *, episodes: int, slots: int = 3):
    envs = [
        {
            "id": "textworld/coin_collector",
            "max_steps": 4,
            "kwargs": {"level": 1, "n_train": 4, "cache_dir": str(games_dir)},
        },
        {"id": "math/gsm_symbolic"},  # answered in free text: `generate` samples, where the games use `choose`
    ]
    return config_from_dict(
        {
            "name": "replay",
            "seed": 7,
            "model": {"temperature": 1.0, **model},
            "agent": {"explore": 0.2},
            "envs": envs,
            "runtime": {"slots": slots, "episodes": episodes},
        }
    )


def kill_at_commit(loop: AgentLoop, n: int) -> None:
    """The n-th commit of `loop` dies before it is written, like a `kill -9` at that moment (the episodes in flight
    are lost and their draws stay open)."""
    add_episode, count = loop.store.add_episode, {"n": 0}

    def wrapped(*args, **kwargs):
        count["n"] += 1
        if count["n"] == n:
            raise Killed("kill -9")
        return add_episode(*args, **kwargs)

    loop.store.add_episode = wrapped


def played(workdir) -> dict[int, tuple]:
    """Every committed episode by its draw: what was played and how."""
    with ExperienceStore.open(workdir) as store:
        [run] = store.runs()
        episodes = [store.episode(e.id) for e in store.episodes(run.id, limit=1000)]
    return {
        e.metadata["draw"]: (
            e.env_id,
            e.task_id,
            e.seed,
            e.outcome,
            [(s.response, s.action, bool(s.info.get("explored"))) for s in e.steps],
        )
        for e in episodes
    }


def play_killed_and_resumed(config, workdir, kill_at: int) -> None:
    loop = AgentLoop(config, workdir, progress=False)
    kill_at_commit(loop, kill_at)
    with pytest.raises(Killed):
        loop.run()
    loop.close()
    loop = AgentLoop(config, workdir, resume=True, progress=False)
    loop.run()
    loop.close()


def play_through(config, workdir) -> None:
    loop = AgentLoop(config, workdir, progress=False)
    loop.run()
    loop.close()


def assert_replays(config, tmp_path, kill_at: int, episodes: int) -> None:
    play_through(config, tmp_path / "never-killed")
    play_killed_and_resumed(config, tmp_path / "killed", kill_at)
    whole, resumed = played(tmp_path / "never-killed"), played(tmp_path / "killed")
    assert sorted(whole) == sorted(resumed) == list(range(episodes))
    differing = [draw for draw in whole if whole[draw] != resumed[draw]]
    assert not differing, f"draws played differently after the resume: {differing}"
    assert any(len({a for _, a, _ in ep[4]}) > 1 for ep in whole.values()), "the policy sampled, not one action"


@pytest.mark.slow
def test_a_killed_and_resumed_scripted_run_plays_the_same_episodes(tmp_path, games_dir):
    config = make_config(games_dir, {"name": "scripted", "backend": "scripted"}, episodes=16)
    assert_replays(config, tmp_path, kill_at=5, episodes=16)


@pytest.mark.slow
def test_a_killed_and_resumed_transformers_run_plays_the_same_episodes(tmp_path, games_dir, tiny_model_dir):
    model = {"name": str(tiny_model_dir), "max_new_tokens": 6, "dtype": "float32"}
    config = make_config(games_dir, model, episodes=10)
    assert_replays(config, tmp_path, kill_at=4, episodes=10)
