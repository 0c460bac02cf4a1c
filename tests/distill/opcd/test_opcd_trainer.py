"""OPCDTrainer: the learning check (a short run lowers the held-out KL and moves the LoRA weights),
teacher/student plumbing, divergence guard, adapter I/O.

The tiny model is first taught (plain SFT, ~2 s) to answer "take coin" when the system message carries the
lesson and a random move otherwise, so that the context changes the teacher's distribution strongly; the
trainers must then move that behaviour into the LoRA weights of the student, which never sees the lesson.
"""

from __future__ import annotations

import copy
import random

import numpy as np
import pytest
import torch

from agent_runtime.testing import tiny_model_and_tokenizer
from distill.opcd.adapters import load_adapter
from distill.opcd.config import OPCDConfig
from distill.opcd.scoring import response_hidden
from distill.opcd.trainer import DivergenceError, OPCDTrainer, with_context
from modelkit.prefix_kv import FrozenPrefixes, run_prefix, shared_prefix_length

LESSON = "Lessons from your past experience: always take coin."
MOVES = ["go north", "go south", "go east", "go west", "look", "inventory", "open door"]


def room(i: int) -> list[dict]:
    return [
        {"role": "system", "content": "You play a text game."},
        {"role": "user", "content": f"You are in room {i}. What do you do?"},
    ]


TRAIN, HELD_OUT = [room(i) for i in range(30)], [room(i) for i in range(30, 40)]


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Tiny matmuls gain nothing from threads, and on a shared 2-core machine two spinning OpenMP threads per
    process make each step ~30x slower; one thread keeps this module fast."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _batch(rows: list[tuple[list[int], list[int]]], pad_id: int):
    """(prompt, answer) token rows right-padded into input_ids, attention_mask, and labels on the answers only."""
    width = max(len(p) + len(a) for p, a in rows)
    ids = torch.full((len(rows), width), pad_id)
    labels, mask = torch.full((len(rows), width), -100), torch.zeros(len(rows), width, dtype=torch.long)
    for r, (p, a) in enumerate(rows):
        ids[r, : len(p) + len(a)] = torch.tensor(p + a)
        labels[r, len(p) : len(p) + len(a)] = torch.tensor(a)
        mask[r, : len(p) + len(a)] = 1
    return ids, mask, labels


@pytest.fixture(scope="module")
def taught():
    """A tiny Llama that says "take coin" with the lesson in context, and a random move without it.

    Trained until a probe shows that behaviour, not for a fixed number of steps: learning to look back at the
    lesson is a sudden transition whose step depends on float rounding, which differs between CPUs (MKL and
    ATen pick AVX2/AVX-512 kernels by CPU, and threads change reduction order). At lr 1e-2 without clipping
    this probe passed anywhere from step 60 to 140 over 8 data seeds, and at step 60 P(take coin | lesson)
    was 0.38 to 0.68 depending on the kernels alone: the fixed 60 steps gave a teacher that the lesson barely
    changed on some CPUs. Clipping the gradient and halving the lr make the transition early and tight (step
    40-50 over 16 data seeds, with AVX-512, AVX2 or plain kernels and 1 or 2 threads); the loop stops there,
    and the assert says so if it never comes."""
    model, tok = tiny_model_and_tokenizer("llama", hidden_size=64, layers=2, heads=4)

    def encode(chat):
        return tok(tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True), add_special_tokens=False)[
            "input_ids"
        ]

    coin = tok("take coin", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    probe_rooms = TRAIN[:4] + HELD_OUT[:4]
    probe = _batch(
        [(encode(with_context(c, LESSON)), coin) for c in probe_rooms] + [(encode(c), coin[:1]) for c in probe_rooms],
        tok.pad_token_id,
    )  # P(first token "take")

    def probe_probabilities() -> tuple[float, float]:
        """(lowest P("take coin<eos>") with the lesson, highest P("take") without it) over the probe rooms."""
        ids, mask, labels = probe
        with torch.no_grad():
            logprobs = model(input_ids=ids, attention_mask=mask).logits[:, :-1].log_softmax(-1)
        targets = labels[:, 1:]
        picked = logprobs.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1) * (targets != -100)
        p = picked.sum(-1).exp()
        return float(p[: len(probe_rooms)].min()), float(p[len(probe_rooms) :].max())

    rng = random.Random(0)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3)
    for step in range(1, 301):
        rows = []
        for _ in range(16):
            lesson = rng.random() < 0.5
            chat = with_context(room(rng.randrange(30)), LESSON) if lesson else room(rng.randrange(30))
            answer = tok("take coin" if lesson else rng.choice(MOVES), add_special_tokens=False)["input_ids"]
            rows.append((encode(chat), answer + [tok.eos_token_id]))
        ids, mask, labels = _batch(rows, tok.pad_token_id)
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        if step % 10 == 0:
            with_lesson, without = probe_probabilities()
            if with_lesson > 0.95 and without < 0.02:
                break
    assert with_lesson > 0.95 and without < 0.02, (
        f"the tiny teacher did not learn the lesson in {step} steps: P(take coin | lesson) >= {with_lesson:.3f},"
        f" P(take | no lesson) <= {without:.3f}"
    )
    return model.eval(), tok


def _config(**overrides) -> OPCDConfig:
    base = {
        "lr": 2e-2,
        "k": 64,
        "temperature": 1.0,
        "max_new_tokens": 8,
        "batch_size": 8,
        "steps": 30,
        "lora_r": 8,
        "lora_alpha": 16,
        "sampler": "merged-fp32",
        "min_shared_prefix": 8,
    }
    return OPCDConfig(**{**base, **overrides})


def _lora_weights(trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" in n}


@pytest.mark.parametrize(
    "objective",
    ["opcd", pytest.param("off_policy", marks=pytest.mark.slow), pytest.param("sft", marks=pytest.mark.slow)],
)
def test_short_run_halves_the_held_out_reverse_kl_and_moves_the_lora_weights(taught, objective):
    """lr 5e-3 and k = the whole tiny vocabulary (exact KL). At the shared config's lr 2e-2 every objective
    overshoots and the student often ends up worse than it started; with k=64 of 512 tokens OPCD's loss (the
    paper's, not renormalised over the top-k) keeps falling below zero after the student has learnt the lesson
    by moving mass off its top-k, until it samples noise: whether the run passed depended on when it stopped.
    Seeded because the LoRA init and the final samples draw from the global RNG (else: on the tests before)."""
    model, tok = taught
    torch.manual_seed(0)
    trainer = OPCDTrainer(copy.deepcopy(model), tok, _config(objective=objective, lr=5e-3, k=len(tok)))
    before_weights = _lora_weights(trainer)
    before = trainer.evaluate_kl(HELD_OUT, LESSON)
    history = trainer.train(TRAIN, LESSON)
    after = trainer.evaluate_kl(HELD_OUT, LESSON)
    assert before > 1.0, "the lesson must change the teacher strongly for this check to mean anything"
    assert after < before / 2, (objective, before, after)
    moved = [n for n, w in _lora_weights(trainer).items() if not torch.equal(w, before_weights[n])]
    assert len(moved) == len(before_weights)
    assert len(history) == 30 and all(m["tokens"] > 0 and m["grad_norm"] >= 0 for m in history)
    answers = [tok.decode(r) for r in trainer._sample_student([trainer.render(c) for c in HELD_OUT[:4]])]
    assert sum(a.startswith("take coin") for a in answers) >= 3, answers


def test_teacher_is_the_base_model_with_the_adapter_disabled(taught):
    model, tok = taught
    trainer = OPCDTrainer(copy.deepcopy(model), tok, _config(steps=3))
    trainer.train(TRAIN, LESSON)
    prompts, responses = [trainer.render(c) for c in TRAIN[:3]], [[5, 6, 7], [8], [9, 10]]
    with torch.no_grad():
        reference = response_hidden(model, prompts, responses, pad_id=tok.pad_token_id)
        teacher, _ = trainer._teacher_hidden(prompts, responses)
        student = response_hidden(trainer._student_lm, prompts, responses, pad_id=tok.pad_token_id)
    torch.testing.assert_close(teacher, reference, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(student, reference, atol=1e-3)  # the student did move


def test_shared_context_prefix_cache_gives_the_same_hidden_states(taught):
    model, tok = taught
    trainer = OPCDTrainer(copy.deepcopy(model), tok, _config())
    prompts = [trainer.render(with_context(c, LESSON)) for c in TRAIN[:4]]
    shared = trainer._shared_prefix(prompts)
    assert shared >= 8
    responses = [[11, 12, 13, 14], [15], [16, 17], [18, 19, 20]]
    with torch.no_grad():
        once = response_hidden(model, prompts, responses, pad_id=tok.pad_token_id, shared_prefix=shared)
        full = response_hidden(model, prompts, responses, pad_id=tok.pad_token_id)
    mask = torch.zeros(4, 4, dtype=torch.bool)
    for row, r in enumerate(responses):
        mask[row, : len(r)] = True
    torch.testing.assert_close(once[mask], full[mask], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("checkpointed", [False, True], ids=["plain", "gradient-checkpointed"])
def test_the_students_shared_prefix_run_once_gives_the_step_of_the_rows_run_whole(taught, checkpointed):
    """A free-text step: the student's rows share their system prompt, which runs once with gradients flowing
    through its KV into every row. The same samples, loss and updated adapter as the rows run whole, with fewer
    tokens through the model; a checkpointed student keeps the prefix too."""
    model, tok = taught
    torch.manual_seed(0)  # the same fresh adapter in both
    shared = OPCDTrainer(copy.deepcopy(model), tok, _config(gradient_checkpointing=checkpointed))
    torch.manual_seed(0)
    whole = OPCDTrainer(copy.deepcopy(model), tok, _config(share_context_cache=False, gradient_checkpointing=False))
    assert shared._share_student_prefix and not whole._share_student_prefix
    assert shared_prefix_length([shared.render(c) for c in TRAIN[:4]], 8) >= 8
    grads = {}
    for trainer in (shared, whole):
        step = trainer.optimizer.step  # the gradients as the optimizer gets them (Adam's first update is ~lr x sign)
        trainer.optimizer.step = lambda t=trainer, step=step: grads.setdefault(t, [p.grad.clone() for p in t._params])
        trainer.step(TRAIN[:4], [LESSON] * 4)
    first, second = shared.history[0], whole.history[0]
    assert first["loss"] == pytest.approx(second["loss"], rel=1e-4)
    assert first["tokens"] == second["tokens"]  # the same responses were sampled
    assert first["train_tokens"] < second["train_tokens"]
    assert sum(float(g.abs().sum()) for g in grads[shared]) > 0
    for a, b in zip(grads[shared], grads[whole]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_the_teachers_shared_prefix_runs_once_per_cycle_and_scores_as_the_rows_run_whole(taught, monkeypatch):
    """The teacher is frozen for the trainer's life: the prefix its rows share (system prompt, lesson) is run once,
    and reused after the student trained (the student moved, the teacher did not), with the hidden states of the
    rows run whole."""
    from modelkit import prefix_kv

    model, tok = taught
    trainer = OPCDTrainer(copy.deepcopy(model), tok, _config(steps=2))
    prompts = [trainer.render(with_context(c, LESSON)) for c in TRAIN[:4]]
    responses = [[11, 12, 13, 14], [15], [16, 17], [18, 19, 20]]
    ran = []
    monkeypatch.setattr(prefix_kv, "run_prefix", lambda m, ids: ran.append(len(ids)) or run_prefix(m, ids))
    trainer._teacher_hidden(prompts, responses)
    assert ran == [trainer._shared_prefix(prompts)]
    trainer.train(TRAIN, LESSON)
    hits = trainer._teacher_prefixes.hits
    again, _ = trainer._teacher_hidden(prompts, responses)
    assert trainer._teacher_prefixes.hits == hits + 1 and len(ran) <= 3  # the train steps' prefixes, at most
    with torch.no_grad():
        full = response_hidden(model, prompts, responses, pad_id=tok.pad_token_id)
    mask = torch.zeros(4, 4, dtype=torch.bool)
    for row, r in enumerate(responses):
        mask[row, : len(r)] = True
    torch.testing.assert_close(again[mask], full[mask], rtol=1e-4, atol=1e-5)


def test_frozen_prefixes_keep_at_most_their_bytes_and_always_the_newest(taught):
    model, _ = taught
    kept = FrozenPrefixes(max_bytes=1)
    first, second = np.arange(5, 15), np.arange(20, 30)
    assert kept(model, first) is not kept(model, second)
    assert kept(model, second) is kept(model, second) and kept.hits == 2
    assert len(kept._kept) == 1 and 0 < kept.nbytes
    roomy = FrozenPrefixes()
    a = roomy(model, first)
    roomy(model, second)
    assert roomy(model, first) is a and len(roomy._kept) == 2


def test_a_qwen2_model_with_sliding_windows_and_biases_trains():
    """Sliding-window layers keep their own cache, so the teacher runs every row whole; the projections' biases
    (Qwen2's q/k/v) reach the merged sampling copy from inside the LoRA-wrapped layers."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = tiny_model_and_tokenizer()[1]
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        use_sliding_window=True,
        sliding_window=64,
        max_window_layers=0,
        tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    trainer = OPCDTrainer(Qwen2ForCausalLM(config), tok, _config(steps=1, batch_size=2))
    prompts = [trainer.render(with_context(c, LESSON)) for c in TRAIN[:2]]
    assert trainer._shared_prefix(prompts) == 0
    assert len(trainer.train(TRAIN, LESSON)) == 1
    ids = torch.tensor([prompts[0]])
    with torch.no_grad(), trainer.policies.sampling_model() as merged:
        torch.testing.assert_close(merged(input_ids=ids).logits, trainer.model(input_ids=ids).logits, rtol=0, atol=1e-4)


@pytest.mark.parametrize("sampler", ["merged-fp32", "merged-bf16"])
def test_sampling_copy_tracks_the_merged_student(taught, sampler):
    model, tok = taught
    trainer = OPCDTrainer(copy.deepcopy(model), tok, _config(steps=2, sampler=sampler))
    trainer.train(TRAIN, LESSON)
    ids = torch.tensor([trainer.render(TRAIN[0])])
    with torch.no_grad():
        student = trainer.model(input_ids=ids).logits
        with trainer.policies.sampling_model() as copy_:
            sampled = copy_(input_ids=ids).logits.float()
        assert all(p.numel() == 0 for p in trainer.policies.sampler.model.parameters())  # released after sampling
        base = model(input_ids=ids).logits
    moved = (student - base).abs().mean()
    error = (sampled - student).abs().mean()
    if sampler == "merged-fp32":
        torch.testing.assert_close(sampled, student, rtol=0, atol=1e-4)
    assert error < 0.2 * moved, (float(error), float(moved))  # bf16 rounding is small next to what training moved


def test_auto_sampler_samples_in_bf16_only_where_the_device_computes_it_natively(taught, monkeypatch):
    """`sampler: auto` (the default): bf16 where the device has native bf16 kernels, fp32 elsewhere (an AVX2 CPU
    emulates bf16, several times slower); the named choices are kept as named."""
    from modelkit import sampler as sampler_module

    model, tok = taught
    assert OPCDConfig().sampler == "auto"
    for native, dtype in ((True, torch.bfloat16), (False, torch.float32)):
        monkeypatch.setattr(sampler_module, "fast_bf16", lambda device, native=native: native)
        trainer = OPCDTrainer(copy.deepcopy(model), tok, _config(sampler="auto"))
        assert trainer.policies.sampler.dtype == dtype
    for named, dtype in (("merged-bf16", torch.bfloat16), ("merged-fp32", torch.float32)):
        assert sampler_module.sampler_dtype(named, "cpu") == dtype
    # the check itself answers for this machine without failing, and a GPU-less CUDA query is not made on CPU
    assert isinstance(sampler_module.fast_bf16("cpu"), bool)
    assert sampler_module.fast_bf16("meta") is False


def test_nan_loss_raises_divergence_error_before_any_update(taught):
    model, tok = taught
    poisoned = copy.deepcopy(model)
    with torch.no_grad():
        poisoned.lm_head.weight[0, 0] = float("nan")  # tied: the teacher's logits become NaN
    trainer = OPCDTrainer(copy.deepcopy(model), tok, _config(), teacher_model=poisoned)
    before = _lora_weights(trainer)
    with pytest.raises(DivergenceError, match="loss is nan"):
        trainer.step(TRAIN[:4], [LESSON] * 4)
    assert all(torch.equal(w, before[n]) for n, w in _lora_weights(trainer).items())


def test_diverging_loss_raises(taught):
    model, tok = taught
    trainer = OPCDTrainer(copy.deepcopy(model), tok, _config(divergence_max_loss=1e-6))
    with pytest.raises(DivergenceError, match="exceeds divergence_max_loss"):
        trainer.train(TRAIN, LESSON, steps=2)


def test_adapter_round_trip_and_parent_adapter_becomes_the_teacher(taught, tmp_path):
    model, tok = taught
    first = OPCDTrainer(copy.deepcopy(model), tok, _config(steps=10))
    first.train(TRAIN, LESSON)
    path = first.save_adapter(tmp_path / "cycle-1")
    assert {"adapter_config.json", "adapter_model.safetensors", "opcd.json"} <= {p.name for p in path.iterdir()}
    ids = torch.tensor([first.render(HELD_OUT[0])])
    with torch.no_grad():
        expected = first.model(input_ids=ids).logits
        loaded = load_adapter(copy.deepcopy(model), path)(input_ids=ids).logits
    torch.testing.assert_close(loaded, expected, rtol=1e-5, atol=1e-5)

    second = OPCDTrainer(copy.deepcopy(model), tok, _config(steps=2), parent_adapter=path)
    assert second.evaluate_kl(HELD_OUT[:4], "") == pytest.approx(0.0, abs=1e-5)  # student starts as the parent
    second.train(TRAIN, "a different lesson")
    prompts, responses = [second.render(HELD_OUT[0])], [[5, 6]]
    with torch.no_grad():
        teacher, _ = second._teacher_hidden(prompts, responses)
        parent = response_hidden(
            load_adapter(copy.deepcopy(model), path).get_base_model(), prompts, responses, pad_id=tok.pad_token_id
        )
    torch.testing.assert_close(teacher, parent, rtol=1e-4, atol=1e-5)


def test_full_finetune_and_cross_size_teacher_run(taught):
    model, tok = taught
    full = OPCDTrainer(copy.deepcopy(model), tok, _config(full_finetune=True, lr=1e-3, steps=2))
    teacher_before = {n: p.clone() for n, p in full.policies.teacher_model.named_parameters()}
    full.train(TRAIN, LESSON)
    assert any(not torch.equal(p, model.state_dict()[n]) for n, p in full.model.named_parameters())
    assert all(torch.equal(p, teacher_before[n]) for n, p in full.policies.teacher_model.named_parameters())

    bigger, _ = tiny_model_and_tokenizer("llama", hidden_size=96, layers=3, heads=4, seed=1)
    cross = OPCDTrainer(copy.deepcopy(model), tok, _config(steps=2), teacher_model=bigger)
    metrics = cross.train(TRAIN, LESSON)
    assert all(torch.isfinite(torch.tensor(m["loss"])) for m in metrics)


def test_config_rejects_unknown_keys():
    with pytest.raises(ValueError, match="extra"):
        OPCDConfig(learning_rate=1e-3)


def test_interrupted_adapter_save_leaves_no_half_directory(taught, tmp_path, monkeypatch):
    import distill.opcd.trainer as trainer_module

    model, tok = taught
    trainer = OPCDTrainer(copy.deepcopy(model), tok, _config(steps=0))

    def crash(directory, metadata):
        assert (directory / "adapter_model.safetensors").exists()  # the weights were half-way written
        raise OSError("killed while writing")

    monkeypatch.setattr(trainer_module, "write_metadata", crash)
    with pytest.raises(OSError, match="killed"):
        trainer.save_adapter(tmp_path / "cycle-1")
    assert list(tmp_path.iterdir()) == []


def test_train_takes_an_iterator_and_per_sample_contexts(taught):
    model, tok = taught
    trainer = OPCDTrainer(copy.deepcopy(model), tok, _config(batch_size=4))
    seen = []

    def pool_for(chat):
        seen.append(chat[1]["content"])
        return LESSON

    history = trainer.train(iter(TRAIN[:10]), pool_for, steps=5)
    assert len(history) == 2  # 10 prompts fill two batches of 4; the iterator then runs dry
    assert seen == [c[1]["content"] for c in TRAIN[:8]]
    pools = OPCDTrainer(copy.deepcopy(model), tok, _config(batch_size=2))
    assert len(pools.train(TRAIN, [LESSON, "another pool"], steps=1)) == 1
    with pytest.raises(ValueError, match="one context per prompt"):
        trainer.step(TRAIN[:2], [LESSON])
