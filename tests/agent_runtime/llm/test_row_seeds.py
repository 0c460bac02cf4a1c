"""Each row of a call samples from its own seed (`SamplingParams.seeds`): the same tokens and the same pick of an action
alone, beside other rows, in another place of the batch, and after other calls; greedy ignores the seeds.

The rows' scores are not bit-identical alone and in a padded batch (the tiny model's token log-probabilities differ by
up to ~5e-7, its choice log-probabilities by ~1.5e-6 on a CPU): a seed fixes the draw, and a difference that small
moves it only when the draw lands within it of the boundary between two outcomes, which these seeds do not."""

from __future__ import annotations

import pytest

from agent_runtime.llm.base import RowSeededBackend, SamplingParams
from agent_runtime.llm.chat_backend import ChatBackend
from agent_runtime.llm.scripted import ScriptedBackend

SAMPLED = SamplingParams(max_new_tokens=8, temperature=1.0)
CHOICES = [["go north", "go south", "take coin"], ["look", "go east", "wait"], ["open door", "close door", "x"]]


def chats(n):
    return [
        [{"role": "system", "content": "Play."}, {"role": "user", "content": "go north " * (i + 1)}] for i in range(n)
    ]


def sampled(backend, rows, seeds, **params):
    """Each row's completion from one call of `rows` (indices into `chats`) with `seeds`."""
    prompts = chats(3)
    call = SamplingParams(**{**SAMPLED.__dict__, **params, "seeds": tuple(seeds)})
    return backend.generate([prompts[r] for r in rows], call)


@pytest.mark.slow
def test_a_rows_tokens_depend_on_its_seed_alone(tiny_backend):
    alone = [sampled(tiny_backend, [r], [100 + r])[0].token_ids for r in range(3)]
    tiny_backend.generate(chats(2), SAMPLED)  # an unseeded call between: nothing carries over
    together = [c.token_ids for c in sampled(tiny_backend, [0, 1, 2], [100, 101, 102])]
    reordered = sampled(tiny_backend, [2, 0], [102, 100])
    assert together == alone and [c.token_ids for c in reordered] == [alone[2], alone[0]]
    others = {tuple(sampled(tiny_backend, [0], [seed])[0].token_ids) for seed in range(6)}
    assert len(others) > 1, "another seed samples otherwise"


def test_greedy_ignores_the_seeds(tiny_backend):
    first = sampled(tiny_backend, [0, 1], [1, 2], temperature=0.0)
    again = sampled(tiny_backend, [0, 1], [3, 4], temperature=0.0)
    assert [c.token_ids for c in first] == [c.token_ids for c in again]


@pytest.mark.slow
@pytest.mark.parametrize("trie_above", [256, 1], ids=["scored", "decoded-under-a-trie"])
def test_a_rows_pick_of_an_action_depends_on_its_seed_alone(tiny_model_dir, trie_above):
    from agent_runtime.llm.transformers_backend import TransformersBackend

    backend = TransformersBackend.from_pretrained(str(tiny_model_dir), dtype="float32", choice_trie_above=trie_above)
    prompts = chats(3)

    def choose(rows, seeds):
        params = SamplingParams(temperature=1.0, seeds=tuple(seeds))
        return [c.text for c in backend.choose([prompts[r] for r in rows], [CHOICES[r] for r in rows], params)]

    picks = {seed: [choose([r], [seed + r])[0] for r in range(3)] for seed in range(5)}
    for seed, alone in picks.items():
        assert choose([0, 1, 2], [seed, seed + 1, seed + 2]) == alone
        assert choose([2, 1], [seed + 2, seed + 1]) == [alone[2], alone[1]]
    assert len({tuple(p) for p in picks.values()}) > 1, "the seeds draw different actions"


def test_the_scripted_policy_picks_by_the_rows_seed():
    backend = ScriptedBackend(seed=0)
    prompt = [{"role": "user", "content": "A room.\nAdmissible actions: a | b | c | d | e | f"}]
    alone = [backend.generate([prompt], SamplingParams(seeds=(seed,)))[0].text for seed in range(10)]
    batched = [c.text for c in backend.generate([prompt] * 10, SamplingParams(seeds=tuple(range(10))))]
    assert batched == alone and len(set(alone)) > 1


def test_one_seed_per_prompt_or_a_clear_error(tiny_backend):
    with pytest.raises(ValueError, match="2 seeds for 3 prompts; give one per prompt"):
        tiny_backend.generate(chats(3), SamplingParams(temperature=1.0, seeds=(1, 2)))


def test_a_remote_chat_model_is_the_backend_that_cannot_seed_each_row(tiny_backend):
    from langchain_core.language_models.fake_chat_models import FakeListChatModel

    assert isinstance(tiny_backend, RowSeededBackend) and isinstance(ScriptedBackend(), RowSeededBackend)
    assert not isinstance(ChatBackend(FakeListChatModel(responses=["x"])), RowSeededBackend)
