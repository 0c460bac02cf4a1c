"""The transformers backend acts with choice scoring over each action set's trie (`modelkit.choice`): the same
choices and distributions as scoring every action whole, over turns that continue the prefix cache, under the KV
bound that splits a call into groups, and in an episode run. Tiny models built in code; float32."""

from __future__ import annotations

import pytest

from agent_runtime.llm.base import SamplingParams
from environments.testing import GuessEnv
from modelkit.choice import action_nodes

SYSTEM = {"role": "system", "content": "You are playing a text adventure game. Reply with exactly one command."}
ROOM = [SYSTEM, {"role": "user", "content": "You are in a kitchen. There is a closed door to the north."}]
COIN = [SYSTEM, {"role": "user", "content": "You see a coin on the floor."}]
SHARED = ["go north", "take coin", "go east", "go west", "take coin from the box", "look"]
DISJOINT = ["look", "inventory", "take coin", "open door"]
NESTED = ["go", "go north", "look", "go north door"]


def _backend(tiny_model_dir, *, tree: bool, **options):
    from agent_runtime.llm.transformers_backend import TransformersBackend

    backend = TransformersBackend.from_pretrained(str(tiny_model_dir), dtype="float32", **options)
    backend.choice_tree = tree
    return backend


def test_acting_over_turns_with_the_prefix_cache_chooses_as_flat_scoring(tiny_model_dir):
    """The backend keeps the chosen action's KV (its columns in the trie) for the next turn, which continues it:
    every turn's distributions and draws are those of flat scoring without any cache."""
    tree = _backend(tiny_model_dir, tree=True, min_shared_prefix=4)
    flat = _backend(tiny_model_dir, tree=False, prefix_cache=False)
    compass = ["go north", "go east", "go west", "go south"]  # after the first, each is fed "go", then its own
    options = [compass, NESTED, compass]
    chats = [list(ROOM), list(COIN), list(COIN)]
    picked = []
    for turn in range(3):
        params = SamplingParams(temperature=1.0, seed=turn)
        a, b = tree.choose(chats, options, params), flat.choose(chats, options, params)
        for x, y in zip(a, b):
            assert x.text == y.text
            assert x.choice_logprobs == pytest.approx(y.choice_logprobs, abs=1e-5)
        picked += [x.text for x in a]
        chats = [
            c + [{"role": "assistant", "content": x.text}, {"role": "user", "content": f"Turn {turn}: nothing."}]
            for c, x in zip(chats, a)
        ]
    assert tree.prefix_stats.reused_tokens > 0
    # an action stored from columns that are not side by side (its prefix was opened by an earlier action)
    assert {"go east", "go west", "go south", "go north door"} & set(picked), picked
    assert tree.prefix_stats.scored_tokens < flat.prefix_stats.scored_tokens


def test_under_a_small_kv_bound_tree_groups_score_as_flat_and_stay_within_it(tiny_model_dir, monkeypatch):
    from agent_runtime.llm.transformers_backend import TransformersBackend
    from modelkit.prefix_kv import kv_bytes_per_token

    bound_mb = 0.2  # two rows of these prompts
    tree = _backend(tiny_model_dir, tree=True, min_shared_prefix=4, choice_batch_mb=bound_mb)
    flat = _backend(tiny_model_dir, tree=False, min_shared_prefix=4)
    per_token = kv_bytes_per_token(tree.model)
    groups = []
    score = TransformersBackend._score_group

    def counted(self, rows, acts):
        if self is tree:
            columns = max(len(action_nodes(a).tokens) for a in acts)
            groups.append((len(rows), len(rows) * (max(map(len, rows)) + columns) * per_token))
        return score(self, rows, acts)

    monkeypatch.setattr(TransformersBackend, "_score_group", counted)
    chats = [ROOM, COIN, ROOM, COIN, ROOM]
    options = [SHARED, DISJOINT] * 2 + [NESTED]
    params = SamplingParams(temperature=1.0, seed=3)
    a, b = tree.choose(chats, options, params), flat.choose(chats, options, params)
    for x, y in zip(a, b):
        assert x.text == y.text
        assert x.choice_logprobs == pytest.approx(y.choice_logprobs, abs=1e-5)
    assert len(groups) > 1 and sum(n for n, _ in groups) == len(chats)
    assert all(n == 1 or kv <= bound_mb * 2**20 for n, kv in groups), groups
    assert any(n > 1 for n, _ in groups), "a bound that some rows share"


class WordGuessEnv(GuessEnv):
    """GuessEnv with worded actions that share their openings ("guess 1" ... "guess 5", "look around", "look around
    the room")."""

    def _info(self, won):
        actions = [f"guess {n}" for n in range(1, 6)] + ["look around", "look around the room"]
        return {"admissible_actions": actions, "won": won, "goal": "Guess the number."}

    def _step(self, action):
        guess = action.removeprefix("guess ").strip()
        if not guess.isdigit():
            return "A number between 1 and 5 hides here.", 0.0, False, self._info(False)
        return super()._step(guess)


def test_an_episode_run_plays_the_same_with_tree_and_flat_scoring(tiny_model_dir):
    from agent_runtime.episode.prompt import PromptBuilder
    from agent_runtime.episode.runner import EnvSlotSpec, EpisodeRunner, TaskSampler

    def play(tree: bool):
        backend = _backend(tiny_model_dir, tree=tree, min_shared_prefix=4)
        spec = EnvSlotSpec("testing/word-guess", WordGuessEnv, "text", 4)
        builder = PromptBuilder(
            family="text",
            count_tokens=backend.count_tokens,
            context_window=backend.context_window,
            action_mode="choice",
        )
        runner = EpisodeRunner(
            backend, [spec], [builder], SamplingParams(max_new_tokens=8, temperature=1.0), slots=2, seed=11
        )
        sampler = TaskSampler([1.0], [[f"train-{i}" for i in range(6)]], seed=11)
        draws = [sampler.draw(i) for i in range(6)]
        episodes = []
        runner.run(lambda: draws.pop(0) if draws else None, episodes.append)
        runner.close()
        played = sorted(
            (e.metadata["draw"], e.task_id, e.won, [(s.action, s.reward) for s in e.steps]) for e in episodes
        )
        scores = {(e.metadata["draw"], k): s.info["choice_logprobs"] for e in episodes for k, s in enumerate(e.steps)}
        return played, scores, backend.prefix_stats.scored_tokens

    tree, tree_scores, tree_columns = play(True)
    flat, flat_scores, flat_columns = play(False)
    assert tree == flat
    assert tree_scores.keys() == flat_scores.keys()
    for key in tree_scores:
        assert tree_scores[key] == pytest.approx(flat_scores[key], abs=1e-5)
    assert sum(len(steps) for *_, steps in tree) > 6 and len({a for *_, s in tree for a, _ in s}) > 2
    assert tree_columns < flat_columns
