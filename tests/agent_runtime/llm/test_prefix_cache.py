"""The transformers backend's prefix KV cache (`agent_runtime.llm.prefix_cache`): same greedy tokens, prompt
lengths and logprobs as the plain batched path (base model and with a LoRA adapter), within one call (a prefix shared by
the rows) and across calls (each row's stored conversation, as an agent loop sends it turn after turn: rows joining and
leaving, a history cut at the front, an adapter switch); seeded sampling still repeats; the cache really saves prefill;
the store stays within its token budget; short or single-row batches and a disabled cache fall back to plain generation.
"""

from __future__ import annotations

import pytest
import torch

from agent_runtime.llm import SamplingParams
from agent_runtime.llm.transformers_backend import TransformersBackend

SYSTEM = "You are playing a text game. Lessons: " + " ".join(
    f"Rule {i}: open the door before going north and take the coin." for i in range(12)
)


def chats():
    users = ["go north", "look around the kitchen carefully", "take coin"]
    return [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": u}] for u in users]


@pytest.fixture(scope="module")
def backends(tiny_model_dir):
    on = TransformersBackend.from_pretrained(str(tiny_model_dir), dtype="float32")
    off = TransformersBackend.from_pretrained(str(tiny_model_dir), dtype="float32", prefix_cache=False)
    return on, off


def save_random_adapter(path) -> None:
    """A LoRA adapter with random (not zero) weights for the tiny model, so that it changes the outputs."""
    from peft import LoraConfig, get_peft_model

    from agent_runtime.testing import tiny_model_and_tokenizer

    model, _ = tiny_model_and_tokenizer()
    peft_model = get_peft_model(
        model, LoraConfig(r=4, target_modules=["q_proj", "v_proj", "o_proj"], init_lora_weights=False)
    )
    peft_model.save_pretrained(path)


def test_the_prompts_share_a_long_prefix(backends):
    on, _ = backends
    rows = [on.tokenizer(on.render(c), add_special_tokens=False)["input_ids"] for c in chats()]
    assert on.prefix_kv.shared_prefix(rows) >= 100
    assert len(set(map(len, rows))) > 1  # the rows need padding, so the layout matters


def test_greedy_tokens_logprobs_and_prompt_lengths_match_the_plain_path(backends):
    on, off = backends
    params = SamplingParams(max_new_tokens=12, temperature=0.0, logprobs=True)
    on.clear_prefix_cache()
    before = on.prefix_stats.shared_tokens
    cached, plain = on.generate(chats(), params), off.generate(chats(), params)
    assert on.prefix_stats.shared_tokens - before >= 300 and not off.prefix_kv.entries  # the shared prefix was used
    assert [c.token_ids for c in cached] == [c.token_ids for c in plain]
    assert [c.prompt_tokens for c in cached] == [c.prompt_tokens for c in plain]
    assert [c.text for c in cached] == [c.text for c in plain]
    for a, b in zip(cached, plain):
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)
    reused = on.prefix_stats.reused_tokens
    again = on.generate(chats(), params)  # the second call reuses the stored rows, which must be unchanged
    assert [c.token_ids for c in again] == [c.token_ids for c in plain]
    assert on.prefix_stats.reused_tokens - reused == sum(c.prompt_tokens - 1 for c in plain)
    assert len(on.prefix_kv.entries) == 3


def test_seeded_sampling_repeats_and_matches_the_plain_path(backends):
    on, off = backends
    params = SamplingParams(max_new_tokens=10, temperature=1.0, seed=3)
    first = [c.token_ids for c in on.generate(chats(), params)]
    assert first == [c.token_ids for c in on.generate(chats(), params)]
    assert first == [c.token_ids for c in off.generate(chats(), params)]


def test_matches_the_plain_path_with_an_adapter_active(tmp_path, tiny_model_dir):
    save_random_adapter(tmp_path / "adapter")
    params = SamplingParams(max_new_tokens=10, temperature=0.0, logprobs=True)
    outs = {}
    for flag in (True, False):
        backend = TransformersBackend.from_pretrained(str(tiny_model_dir), dtype="float32", prefix_cache=flag)
        base = backend.generate(chats(), params)
        backend.load_adapter("a1", tmp_path / "adapter")
        assert not backend.prefix_kv.entries  # loading an adapter drops sequences computed without it
        tuned = backend.generate(chats(), params)
        backend.use_adapter("a1")  # re-activating the active adapter keeps its sequences, switching drops them
        assert bool(backend.prefix_kv.entries) == flag
        backend.use_adapter(None)
        assert not backend.prefix_kv.entries
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
    assert on.prefix_kv.shared_prefix(rows) == 0  # below min_shared_prefix
    assert on.prefix_kv.shared_prefix(rows[:1]) == 0
    same = [chats()[0], chats()[0]]
    rows = [on.tokenizer(on.render(c), add_special_tokens=False)["input_ids"] for c in same]
    assert on.prefix_kv.shared_prefix(rows) == len(rows[0]) - 1  # every row keeps one token of its own
    params = SamplingParams(max_new_tokens=6, temperature=0.0)
    a, b = on.generate(same, params)
    assert a.token_ids == b.token_ids == on.generate(same[:1], params)[0].token_ids


# Across calls: an agent loop's conversations -------------------------------------------------------------------

OBSERVATIONS = [
    "You are in the kitchen. There is a coin on the table.",
    "You go north into a dark hallway.",
    "A locked door blocks the way east.",
    "You see a key under the rug.",
    "The cellar smells of damp.",
]


def play(backend, schedule, params, adapters=None):
    """Turns of a multi-slot agent loop: `schedule` lists, per turn, the live slots; a slot's chat is the system
    prompt, its past (observation, reply) turns and a new observation. A slot name ending in "-" drops its
    oldest turn first (a context window that filled up). Returns every turn's completions."""
    history: dict[str, list[tuple[str, str]]] = {}
    turns = []
    for t, live in enumerate(schedule):
        if adapters:
            backend.use_adapter(adapters[t])
        chats = []
        for slot in live:
            name = slot.rstrip("-")
            past = history.setdefault(name, [])
            if slot.endswith("-"):
                del past[0]
            observation = f"{name}, turn {t}: {OBSERVATIONS[(t + len(name)) % len(OBSERVATIONS)]}"
            chat = [{"role": "system", "content": SYSTEM}]
            for seen, reply in past:
                chat += [{"role": "user", "content": seen}, {"role": "assistant", "content": reply}]
            chats.append(chat + [{"role": "user", "content": observation}])
            past.append((observation, ""))
        completions = backend.generate(chats, params)
        for slot, completion in zip(live, completions):
            past = history[slot.rstrip("-")]
            past[-1] = (past[-1][0], completion.text.strip())
        turns.append(completions)
    return turns


def assert_same(cached_turns, plain_turns):
    for cached, plain in zip(cached_turns, plain_turns, strict=True):
        assert [c.token_ids for c in cached] == [c.token_ids for c in plain]
        assert [c.prompt_tokens for c in cached] == [c.prompt_tokens for c in plain]
        assert [c.finish_reason for c in cached] == [c.finish_reason for c in plain]
        for a, b in zip(cached, plain):
            assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)


SCHEDULE = [["a", "b", "c"], ["a", "b", "c"], ["a", "c", "d"], ["a", "c-", "d", "e"], ["d"], ["a", "d", "e"]]


def test_multi_turn_conversations_match_the_plain_path_and_skip_most_prefill(tiny_model_dir):
    params = SamplingParams(max_new_tokens=10, temperature=0.0, logprobs=True)
    on = TransformersBackend.from_pretrained(str(tiny_model_dir), dtype="float32")
    off = TransformersBackend.from_pretrained(str(tiny_model_dir), dtype="float32", prefix_cache=False)
    cached, plain = play(on, SCHEDULE, params), play(off, SCHEDULE, params)
    assert_same(cached, plain)
    stats = on.prefix_stats
    assert stats.prompt_tokens == off.prefix_stats.prompt_tokens == off.prefix_stats.prefilled_tokens
    assert stats.reused_tokens > 0.7 * stats.prompt_tokens  # histories and the system prompt came from the store
    assert stats.prefilled_tokens < 0.25 * stats.prompt_tokens
    assert any(c.finish_reason == "length" for turn in plain for c in turn)  # replies fed back to full length


def test_rows_continue_their_own_stored_conversation(tiny_model_dir):
    backend = TransformersBackend.from_pretrained(str(tiny_model_dir), dtype="float32")
    params = SamplingParams(max_new_tokens=6, temperature=0.0)
    play(backend, [["a", "b"], ["a", "b"]], params)
    assert len(backend.prefix_kv.entries) == 2  # one sequence per slot: each turn supersedes the slot's last one
    rows = [e.ids for e in backend.prefix_kv.entries.values()]
    before = backend.prefix_stats.reused_tokens
    turns = play(backend, [["a", "b"], ["a", "b"], ["a", "b"]], params)  # the same conversations again
    # every prompt but the first turn's was stored (prompt + reply), so only the new observation is prefilled
    assert backend.prefix_stats.reused_tokens - before > sum(len(r) for r in rows)
    assert len(backend.prefix_kv.entries) == 2 and sum(c.prompt_tokens for c in turns[0]) > 0


def test_adapter_switches_between_turns_match_the_plain_path(tmp_path, tiny_model_dir):
    save_random_adapter(tmp_path / "adapter")
    params = SamplingParams(max_new_tokens=8, temperature=0.0, logprobs=True)
    schedule, adapters = SCHEDULE[:4], [None, "a1", "a1", None]
    runs = []
    for flag in (True, False):
        backend = TransformersBackend.from_pretrained(str(tiny_model_dir), dtype="float32", prefix_cache=flag)
        backend.load_adapter("a1", tmp_path / "adapter")
        runs.append(play(backend, schedule, params, adapters))
    assert_same(*runs)


def test_a_stored_sequence_is_one_allocation(tiny_model_dir):
    """Every stored sequence's keys and values, all layers, are views of one block of exactly its size: dropping it
    frees one allocation (a mapping of its own once it is 1 MB or more) rather than two small tensors per layer
    left in the heap, and the block's bytes are what the store counts against its bound."""
    params = SamplingParams(max_new_tokens=6, temperature=0.0, logprobs=True)
    backend = TransformersBackend.from_pretrained(str(tiny_model_dir), dtype="float32")
    play(backend, SCHEDULE[:3], params)
    entries = list(backend.prefix_kv.entries.values())
    assert entries
    for entry in entries:
        tensors = [*entry.keys, *entry.values]
        storages = {t.untyped_storage().data_ptr() for t in tensors}
        assert len(storages) == 1
        assert tensors[0].untyped_storage().nbytes() == sum(t.numel() * t.element_size() for t in tensors)
    assert backend.prefix_kv.bytes == sum(e.keys[0].untyped_storage().nbytes() for e in entries)


def test_the_store_stays_within_its_token_budget(tiny_model_dir):
    params = SamplingParams(max_new_tokens=6, temperature=0.0, logprobs=True)
    off = TransformersBackend.from_pretrained(str(tiny_model_dir), dtype="float32", prefix_cache=False)
    plain = play(off, SCHEDULE, params)
    longest = max(c.prompt_tokens for turn in plain for c in turn) + params.max_new_tokens
    small = TransformersBackend.from_pretrained(str(tiny_model_dir), dtype="float32", prefix_cache_tokens=2 * longest)
    assert_same(play(small, SCHEDULE, params), plain)
    assert small.prefix_stats.evicted > 0 and len(small.prefix_kv.entries) <= 2
    assert small.prefix_kv.tokens == sum(len(e.ids) for e in small.prefix_kv.entries.values()) <= 2 * longest
    assert small.prefix_stats.reused_tokens > 0  # what fits is still reused
    none = TransformersBackend.from_pretrained(str(tiny_model_dir), dtype="float32", prefix_cache_tokens=0)
    assert_same(play(none, SCHEDULE, params), plain)
    assert not none.prefix_kv.entries
    assert none.prefix_stats.reused_tokens == 0 and none.prefix_stats.shared_tokens > 0


def test_the_store_stays_within_its_memory_budget(tiny_model_dir):
    """`prefix_cache_mb` bounds the stored KV in bytes: two sequences' worth keeps at most that, still reuses, and
    plays exactly as without the cache; 0 stores nothing."""
    params = SamplingParams(max_new_tokens=6, temperature=0.0, logprobs=True)
    off = TransformersBackend.from_pretrained(str(tiny_model_dir), dtype="float32", prefix_cache=False)
    plain = play(off, SCHEDULE, params)
    longest = max(c.prompt_tokens for turn in plain for c in turn) + params.max_new_tokens
    config = off.model.config
    per_token = (
        2
        * config.num_hidden_layers
        * config.num_key_value_heads
        * (config.hidden_size // config.num_attention_heads)
        * 4
    )
    budget = 2 * longest * per_token
    small = TransformersBackend.from_pretrained(str(tiny_model_dir), dtype="float32", prefix_cache_mb=budget / 2**20)
    assert_same(play(small, SCHEDULE, params), plain)
    stored = sum(t.numel() * t.element_size() for e in small.prefix_kv.entries.values() for t in (*e.keys, *e.values))
    assert small.prefix_stats.evicted > 0 and small.prefix_kv.bytes == stored <= budget
    assert small.prefix_stats.reused_tokens > 0
    none = TransformersBackend.from_pretrained(str(tiny_model_dir), dtype="float32", prefix_cache_mb=0)
    assert_same(play(none, SCHEDULE, params), plain)
    assert not none.prefix_kv.entries and none.prefix_stats.reused_tokens == 0


def test_the_preallocated_cache_layer_grows_past_its_planned_room():
    from modelkit.prefix_kv import preallocated_layer_class

    layer = preallocated_layer_class()(capacity=3)
    keys = [torch.randn(2, 1, n, 4) for n in (2, 1, 3, 1)]  # a prefill, then more than the 3 planned
    for k in keys:
        out, _ = layer.update(k, -k)
    assert torch.equal(out, torch.cat(keys, dim=2)) and torch.equal(layer.values, -out)
    assert layer.get_seq_length() == 7
