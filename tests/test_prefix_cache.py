"""The transformers backend's shared-prefix KV cache: same greedy tokens, prompt lengths and logprobs as the plain
batched path (base model and with a LoRA adapter), seeded sampling still repeats, and short or single-row batches
and a disabled cache fall back to plain generation."""

from __future__ import annotations

import pytest
import torch

from agent_runtime.llm import SamplingParams
from agent_runtime.llm.transformers_backend import TransformersBackend

SYSTEM = "You are playing a text game. Lessons: " + " ".join(
    f"Rule {i}: open the door before going north and take the coin." for i in range(12))


def chats():
    users = ["go north", "look around the kitchen carefully", "take coin"]
    return [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": u}] for u in users]


@pytest.fixture(scope="module")
def backends(tiny_model_dir):
    on = TransformersBackend.from_pretrained(str(tiny_model_dir), dtype="float32")
    off = TransformersBackend.from_pretrained(str(tiny_model_dir), dtype="float32", prefix_cache=False)
    return on, off


def test_the_prompts_share_a_long_prefix(backends):
    on, _ = backends
    rows = [on.tokenizer(on.render(c), add_special_tokens=False)["input_ids"] for c in chats()]
    assert on._shared_prefix(rows) >= 100
    assert len(set(map(len, rows))) > 1  # the rows need padding, so the layout matters


def test_greedy_tokens_logprobs_and_prompt_lengths_match_the_plain_path(backends):
    on, off = backends
    params = SamplingParams(max_new_tokens=12, temperature=0.0, logprobs=True)
    cached, plain = on.generate(chats(), params), off.generate(chats(), params)
    assert on._prefix_kv and not off._prefix_kv  # the cache was really used
    assert [c.token_ids for c in cached] == [c.token_ids for c in plain]
    assert [c.prompt_tokens for c in cached] == [c.prompt_tokens for c in plain]
    assert [c.text for c in cached] == [c.text for c in plain]
    for a, b in zip(cached, plain):
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)
    again = on.generate(chats(), params)  # second call reuses the stored prefix, which must be unchanged
    assert [c.token_ids for c in again] == [c.token_ids for c in plain]
    assert len(on._prefix_kv) == 1


def test_seeded_sampling_repeats_and_matches_the_plain_path(backends):
    on, off = backends
    params = SamplingParams(max_new_tokens=10, temperature=1.0, seed=3)
    first = [c.token_ids for c in on.generate(chats(), params)]
    assert first == [c.token_ids for c in on.generate(chats(), params)]
    assert first == [c.token_ids for c in off.generate(chats(), params)]


def test_matches_the_plain_path_with_an_adapter_active(tmp_path, tiny_model_dir):
    from peft import LoraConfig, get_peft_model

    from agent_runtime.testing import tiny_model_and_tokenizer

    model, _ = tiny_model_and_tokenizer()
    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj", "o_proj"],
                                                  init_lora_weights=False))
    peft_model.save_pretrained(tmp_path / "adapter")
    params = SamplingParams(max_new_tokens=10, temperature=0.0, logprobs=True)
    outs = {}
    for flag in (True, False):
        backend = TransformersBackend.from_pretrained(str(tiny_model_dir), dtype="float32", prefix_cache=flag)
        base = backend.generate(chats(), params)
        backend.load_adapter("a1", tmp_path / "adapter")
        assert not backend._prefix_kv  # loading an adapter drops prefixes computed without it
        tuned = backend.generate(chats(), params)
        backend.use_adapter("a1")  # re-activating the active adapter keeps its prefix, switching drops it
        assert bool(backend._prefix_kv) == flag
        backend.use_adapter(None)
        assert not backend._prefix_kv
        back = backend.generate(chats(), params)
        outs[flag] = (base, tuned, back)
    for cached, plain in zip(outs[True], outs[False]):
        assert [c.token_ids for c in cached] == [c.token_ids for c in plain]
        for a, b in zip(cached, plain):  # logprobs are sensitive to a wrong prefix even where argmax is not
            assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)
    base, tuned, back = (torch.tensor([c.logprobs for c in out]) for out in outs[True])
    # the adapter changes outputs, and the base model's prefix is not reused for it (nor its prefix for the base)
    assert not torch.allclose(tuned, base, atol=1e-2) and torch.allclose(back, base, atol=1e-4)


def test_short_prefixes_single_rows_and_identical_prompts(backends):
    on, _ = backends
    short = [[{"role": "user", "content": "go north"}], [{"role": "user", "content": "go south"}]]
    rows = [on.tokenizer(on.render(c), add_special_tokens=False)["input_ids"] for c in short]
    assert on._shared_prefix(rows) == 0  # below min_shared_prefix
    assert on._shared_prefix(rows[:1]) == 0
    same = [chats()[0], chats()[0]]
    rows = [on.tokenizer(on.render(c), add_special_tokens=False)["input_ids"] for c in same]
    assert on._shared_prefix(rows) == len(rows[0]) - 1  # every row keeps one token of its own
    params = SamplingParams(max_new_tokens=6, temperature=0.0)
    a, b = on.generate(same, params)
    assert a.token_ids == b.token_ids == on.generate(same[:1], params)[0].token_ids
