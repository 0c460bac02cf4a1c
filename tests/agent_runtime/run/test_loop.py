"""The loop end to end: episodes from real environments into SQLite, with the tiny model and the scripted policy,
errors recorded as data, stop and resume without losing or duplicating a draw."""

from __future__ import annotations

import pytest

from agent_runtime.config import config_from_dict
from agent_runtime.run.loop import AgentLoop, PhaseNotAvailableError
from environments.base import EnvSpec, TextEnv
from memory import ExperienceStore


def make_config(games_dir, *, model=None, episodes=6, slots=2, envs=None, **extra):
    model = model or {"name": "scripted", "backend": "scripted"}
    envs = envs or [
        {
            "id": "textworld/coin_collector",
            "max_steps": 4,
            "kwargs": {"level": 1, "n_train": 4, "cache_dir": str(games_dir)},
        }
    ]
    data = {"name": "t", "model": model, "envs": envs, "runtime": {"slots": slots, "episodes": episodes}}
    data.update(extra)
    return config_from_dict(data)


def draws(store, run_id):
    return sorted(e.metadata["draw"] for e in store.episodes(run_id, limit=10_000))


def test_tiny_model_episode_end_to_end_into_sqlite(tmp_path, games_dir, tiny_model_dir):
    config = make_config(games_dir, model={"name": str(tiny_model_dir), "max_new_tokens": 6}, episodes=2)
    loop = AgentLoop(config, tmp_path, progress=False)
    summary = loop.run()
    loop.close()
    assert summary.episodes == 2 and summary.completion_tokens > 0
    assert (tmp_path / "config.resolved.yaml").is_file() and (tmp_path / "memory.db").is_file()
    with ExperienceStore.open(tmp_path) as store:
        [run] = store.runs()
        assert run.status == "finished" and run.state["episodes"] == 2
        episodes = store.episodes(run.id)
        assert len(episodes) == 2
        ep = store.episode(episodes[0].id)
        assert ep.env_id == "textworld/coin_collector" and ep.policy == str(tiny_model_dir)
        assert ep.outcome in ("won", "lost", "truncated") and 1 <= len(ep.steps) <= 4
        step = ep.steps[0]
        assert "<|im_start|>system" in step.prompt and step.observation  # the chat template was applied
        assert step.prompt_tokens > 0 and step.completion_tokens > 0 and step.latency_s > 0
        assert step.admissible_actions and all(isinstance(a, str) for a in step.admissible_actions)
        assert ep.prompt_tokens == sum(s.prompt_tokens for s in ep.steps)


def test_scripted_mixture_of_two_envs(tmp_path, games_dir):
    envs = [
        {
            "id": "textworld/coin_collector",
            "weight": 1,
            "max_steps": 6,
            "kwargs": {"level": 1, "n_train": 4, "cache_dir": str(games_dir)},
        },
        {"id": "math/gsm_symbolic", "weight": 1},
    ]
    loop = AgentLoop(make_config(games_dir, envs=envs, episodes=30, slots=4), tmp_path, progress=False)
    summary = loop.run()
    loop.close()
    assert summary.episodes == 30
    with ExperienceStore.open(tmp_path) as store:
        episodes = store.episodes(summary.run_id, limit=100)
        by_env = {e.env_id for e in episodes}
        assert by_env == {"textworld/coin_collector", "math/gsm_symbolic"}
        math_eps = [e for e in episodes if e.env_id == "math/gsm_symbolic"]
        assert all(e.num_steps == 1 and e.outcome in ("won", "lost") for e in math_eps)
        games = [e for e in episodes if e.env_id == "textworld/coin_collector"]
        assert any(e.won for e in games), "random admissible actions win some level-1 coin games"
        assert draws(store, summary.run_id) == list(range(30))


def test_resume_continues_counters_without_duplicates(tmp_path, games_dir):
    loop = AgentLoop(make_config(games_dir, episodes=5, slots=3), tmp_path, progress=False)
    first = loop.run()
    loop.close()
    loop = AgentLoop(make_config(games_dir, episodes=12, slots=3), tmp_path, resume=True, progress=False)
    second = loop.run()
    loop.close()
    assert second.run_id == first.run_id and second.episodes == 12 and second.new_episodes == 7
    with ExperienceStore.open(tmp_path) as store:
        assert draws(store, first.run_id) == list(range(12))


def test_same_seed_same_tasks(tmp_path, games_dir):
    runs = []
    for name in ("a", "b"):
        loop = AgentLoop(make_config(games_dir, episodes=6), tmp_path / name, progress=False)
        runs.append(loop.run())
        loop.close()
    tasks = []
    for name, summary in zip(("a", "b"), runs):
        with ExperienceStore.open(tmp_path / name) as store:
            tasks.append([(e.metadata["draw"], e.task_id, e.seed) for e in store.episodes(summary.run_id)])
    assert sorted(tasks[0]) == sorted(tasks[1])


class ExplodingEnv(TextEnv):
    """A plugin that fails: reset raises on odd tasks, step raises on the second step."""

    spec = EnvSpec(id="tests/exploding", max_steps=5, family="text")

    def __init__(self, cache_dir=None):
        self.steps = 0

    def tasks(self, split):
        return [f"{split}-{i}" for i in range(4)]

    def reset(self, *, seed=None, task_id=None):
        if task_id.endswith(("1", "3")):
            raise RuntimeError("the plugin broke in reset")
        self.steps = 0
        return "a room", {"admissible_actions": ["wait"]}

    def step(self, action):
        self.steps += 1
        if self.steps == 2:
            raise ValueError("the plugin broke in step")
        return ("still a room", 0.0, False, False, {"admissible_actions": ["wait"]})


def test_env_errors_are_recorded_and_the_run_goes_on(tmp_path, games_dir):
    envs = [{"id": "tests.agent_runtime.run.test_loop:ExplodingEnv"}]
    loop = AgentLoop(make_config(games_dir, envs=envs, episodes=12, slots=2), tmp_path, progress=False)
    summary = loop.run()
    loop.close()
    assert summary.episodes == 12 and summary.errors == 12
    with ExperienceStore.open(tmp_path) as store:
        errors = {e.error.split(":")[0] for e in store.episodes(summary.run_id, limit=50)}
    assert errors == {"reset failed", "step failed"}


def test_garbage_output_is_a_recorded_invalid_action(tmp_path, games_dir):
    """In free mode a reply with no action in it is recorded as an invalid action (choice mode cannot produce one)."""
    model = {"name": "scripted", "backend": "scripted", "options": {"mode": "sequence", "replies": ["", "  \n"]}}
    loop = AgentLoop(
        make_config(games_dir, model=model, episodes=1, slots=1, agent={"action_mode": "free"}),
        tmp_path,
        progress=False,
    )
    summary = loop.run()
    loop.close()
    with ExperienceStore.open(tmp_path) as store:
        ep = store.episode(store.episodes(summary.run_id)[0].id)
    assert ep.outcome == "truncated" and len(ep.steps) == 4
    assert all(s.action is None and not s.valid_action for s in ep.steps)


@pytest.mark.slow
def test_lessons_are_extracted_and_enter_the_prompts(tmp_path, games_dir):
    lessons = {"enabled": True, "extract_every": 4, "gate_episodes": 0, "embedder": "hash"}
    loop = AgentLoop(make_config(games_dir, episodes=8, slots=2, lessons=lessons), tmp_path, progress=False)
    summary = loop.run()
    loop.close()
    assert summary.extractions == 2 and summary.lesson_set_version is not None
    with ExperienceStore.open(tmp_path) as store:
        [lesson] = store.lessons(summary.run_id, status="active")
        assert lesson.text == "Take the coin as soon as you see it."
        episodes = sorted(store.episodes(summary.run_id), key=lambda e: e.metadata["draw"])
        # the second extraction found the same item again: merged, with both provenances
        assert set(lesson.source_episode_ids) == {e.id for e in episodes}
        assert all(not e.lessons_in_context for e in episodes[:4])
        first = {
            x.id for x in store.lessons(summary.run_id) if set(x.source_episode_ids) <= {e.id for e in episodes[:4]}
        }
        for e in episodes[4:]:
            assert len(e.lessons_in_context) == 1 and e.lessons_in_context[0] in first
            assert e.lesson_set_version == 1
            assert lesson.text in store.episode(e.id).steps[0].prompt
        assert len(store.extractions(summary.run_id)) == 8  # one per episode read, two phases of four


def test_gate_blocks_a_lesson_set_that_makes_the_policy_worse(tmp_path, games_dir):
    """A scripted policy that wins without lessons and obeys a harmful lesson ("Always reply: lose")."""
    envs = [{"id": "tests.agent_runtime.run.test_loop:LessonSensitiveEnv"}]
    lessons = {"enabled": True, "extract_every": 4, "gate_episodes": 4, "embedder": "hash", "gate_margin": 0.1}
    model = {
        "name": "scripted",
        "backend": "scripted",
        "options": {"follow_lessons": True, "lesson_reply": "- EXPERIENCE ITEM: Always reply: lose"},
    }
    loop = AgentLoop(
        make_config(
            games_dir,
            model=model,
            envs=envs,
            episodes=4,
            slots=2,
            lessons=lessons,
            evaluation={"episodes_per_env": 4},
            agent={"action_mode": "free"},
        ),
        tmp_path,
        progress=False,
    )
    summary = loop.run()
    loop.close()
    with ExperienceStore.open(tmp_path) as store:
        assert store.lessons(summary.run_id, status="active") == []
        [gate] = [e for e in store.evaluations(summary.run_id) if e.split == "gate"]
        assert gate.metrics["promote"] is False
        assert gate.metrics["current_rate"] == 1.0 and gate.metrics["candidate_rate"] == 0.0
    assert summary.lesson_set_version is None or summary.lesson_set_version != gate.lesson_set_version


class LessonSensitiveEnv(TextEnv):
    """Won by the action 'win', the only admissible one; any other reply loses."""

    spec = EnvSpec(id="tests/lesson-sensitive", max_steps=1, family="text")

    def __init__(self, cache_dir=None):
        pass

    def tasks(self, split):
        return [f"{split}-{i}" for i in range(8)]

    def reset(self, *, seed=None, task_id=None):
        return "Say win.", {"admissible_actions": ["win"]}

    def step(self, action):
        won = action == "win"
        return ("done", float(won), True, False, {"won": won})


def test_unavailable_phases_fail_before_anything_runs(tmp_path, games_dir):
    with pytest.raises(PhaseNotAvailableError, match="backend: transformers"):
        AgentLoop(make_config(games_dir, opcd={"enabled": True}, lessons={"enabled": True}), tmp_path, progress=False)
    assert not (tmp_path / "memory.db").exists()


def test_retrieved_examples_show_past_wins(tmp_path, games_dir):
    loop = AgentLoop(
        make_config(games_dir, episodes=12, slots=1, agent={"retrieved_examples": 1}, memory={"embedder": "hash"}),
        tmp_path,
        progress=False,
    )
    summary = loop.run()
    loop.close()
    with ExperienceStore.open(tmp_path) as store:
        episodes = sorted(store.episodes(summary.run_id, limit=50), key=lambda e: e.metadata["draw"])
        first_win = next(i for i, e in enumerate(episodes) if e.won)
        later = [store.episode(e.id).steps[0].prompt for e in episodes[first_win + 1 :]]
    assert later and all("Examples of past successful episodes:" in p and "Winning actions:" in p for p in later)
    assert "Examples of past" not in store_prompt_of(tmp_path, episodes[0].id)


def store_prompt_of(workdir, episode_id):
    with ExperienceStore.open(workdir) as store:
        return store.episode(episode_id).steps[0].prompt


def test_history_shows_admissible_sends_each_turn_as_an_extension_of_the_last(tmp_path, games_dir):
    """agent.history_shows_admissible: every prompt of an episode starts with the previous prompt (what the
    per-slot KV cache needs to reuse all of it)."""
    config = make_config(games_dir, episodes=4, agent={"history_shows_admissible": True})
    loop = AgentLoop(config, tmp_path, progress=False)
    loop.run()
    loop.close()
    with ExperienceStore.open(tmp_path) as store:
        episodes = [store.episode(e.id) for e in store.episodes(loop.run_id)]
    multi = [e for e in episodes if len(e.steps) > 1]
    assert multi, "some coin_collector episode takes more than one step"
    for episode in multi:
        for before, after in zip(episode.steps, episode.steps[1:]):
            assert after.prompt.startswith(before.prompt + "\n<assistant> " + before.response)


def test_the_periodic_summary_counts_the_episodes_played_so_far(tmp_path, games_dir, capsys):
    """Every `summary_every` episodes a line with the episodes committed by then (not the count PLAY started
    with), their success, and the policy's speed."""
    config = make_config(games_dir, episodes=6, slots=2, runtime={"slots": 2, "episodes": 6, "summary_every": 2})
    loop = AgentLoop(config, tmp_path, progress=False)
    summary = loop.run()
    loop.close()
    lines = [line for line in capsys.readouterr().out.splitlines() if "ep/min" in line]
    assert [line.split(" episodes")[0] for line in lines] == ["2", "4", "6"]
    assert all("tok/s" in line for line in lines)
    assert lines[-1].startswith(f"6 episodes, success {summary.won / 6:.1%}")
