"""Data-parallel OPCD training: two CPU ranks (gloo) launched by `run_job` against one process.

Two ranks draw different random samples than one process does, so the equivalence check uses samples that
do not depend on the random draws: `objective="sft"` (the frozen teacher samples, so the samples do not
depend on the weights either) at a temperature of 1e-6, i.e. greedy decoding, with the cross-entropy loss
at temperature 1 (as the sft objective always computes it). The global batch of 3 splits 2 + 1, so the two
ranks see different token counts: a plain mean of the two ranks' gradients would be wrong there, and the
pre-clip gradient norm and the weights would show it.
"""

from __future__ import annotations

import json

import psutil
import pytest
import torch
from safetensors.torch import load_file

import distill.opcd.job as job_module
from distill.opcd import DivergenceError, JobError, OPCDConfig, TrainJob, run_job

LESSON = "Lessons from your past experience: always take coin."


def room(i: int) -> list[dict]:
    return [
        {"role": "system", "content": "You play a text game."},
        {"role": "user", "content": f"You are in room {i}. What do you do?"},
    ]


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """The in-process runs share 2 cores with the launched ranks; one thread each keeps them from thrashing."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _job(model_dir, output, **config) -> TrainJob:
    base = {
        "lr": 1e-2,
        "k": 32,
        "max_new_tokens": 6,
        "batch_size": 3,
        "steps": 3,
        "lora_r": 4,
        "lora_alpha": 8,
        "sampler": "merged-fp32",
        "min_shared_prefix": 8,
    }
    return TrainJob(
        model_path=str(model_dir),
        config=OPCDConfig(**{**base, **config}),
        train_prompts=[room(i) for i in range(6)],
        contexts=[LESSON, "another lesson pool"],
        output=str(output),
        metadata={"cycle_id": 7},
    )


def _job_processes(job_file) -> list[psutil.Process]:
    """Live processes (launcher or ranks) whose command line names this job's file."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if str(job_file) in (proc.info["cmdline"] or []) and proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(proc)
    return found


@pytest.mark.slow
def test_two_ranks_train_the_same_adapter_as_one_process(tiny_model_dir, tmp_path):
    one = run_job(_job(tiny_model_dir, tmp_path / "one", objective="sft", temperature=1e-6))
    streamed = []
    two = run_job(
        _job(tiny_model_dir, tmp_path / "two", objective="sft", temperature=1e-6, processes=2), on_step=streamed.append
    )

    assert [m["step"] for m in streamed] == [1, 2, 3]  # each step once, from rank 0 only
    assert [m["step"] for m in two.steps] == [1, 2, 3]
    for single, parallel in zip(one.steps, two.steps):
        assert parallel["tokens"] == single["tokens"]  # the two shards together are the whole global batch
        assert parallel["loss"] == pytest.approx(single["loss"], rel=1e-5)
        assert parallel["grad_norm"] == pytest.approx(single["grad_norm"], rel=1e-4)
    run_job(_job(tiny_model_dir, tmp_path / "initial", objective="sft", temperature=1e-6, steps=0))
    weights = {name: load_file(tmp_path / name / "adapter_model.safetensors") for name in ("one", "two", "initial")}
    for key, value in weights["one"].items():
        torch.testing.assert_close(weights["two"][key], value, rtol=0, atol=1e-5)
    moved = max(float((value - weights["initial"][key]).abs().max()) for key, value in weights["one"].items())
    assert moved > 1e-2  # the tolerance above is small next to what training moved
    assert sorted(p.name for p in tmp_path.iterdir()) == ["initial", "one", "two"]  # no stray copies
    metadata = json.loads((tmp_path / "two" / "opcd.json").read_text())
    assert metadata["cycle_id"] == 7 and metadata["steps"] == 3 and metadata["config"]["processes"] == 2


@pytest.mark.slow
def test_run_job_streams_steps_and_gives_every_kl_set_before_and_after(tiny_model_dir, tmp_path):
    kl_sets = {
        "heldout": ([room(i) for i in range(10, 15)], LESSON),
        "lesson-3": ([room(i) for i in range(20, 22)], [LESSON, "another lesson pool"]),
    }
    settings = {"objective": "opcd", "temperature": 1.0, "batch_size": 4, "steps": 3, "lr": 5e-2}
    reference = run_job(
        _job(
            tiny_model_dir, tmp_path / "reference", steps=0, **{k: v for k, v in settings.items() if k != "steps"}
        ).model_copy(update={"kl_sets": kl_sets})
    )
    workdir, calls = tmp_path / "job", []

    def on_step(metrics: dict) -> None:
        calls.append((metrics["step"], (workdir / "result.json").exists()))

    job = _job(tiny_model_dir, tmp_path / "adapters" / "cycle-1", processes=2, **settings)
    result = run_job(job.model_copy(update={"kl_sets": kl_sets}), on_step=on_step, workdir=workdir)

    assert [step for step, _ in calls] == [1, 2, 3]
    assert not calls[0][1], "the first step must reach the parent while the job is still running"
    assert set(result.kl_before) == set(result.kl_after) == {"heldout", "lesson-3"}
    for name, value in result.kl_before.items():  # every rank evaluates what one process would
        assert value == pytest.approx(reference.kl_before[name], rel=1e-5)
        assert result.kl_after[name] != pytest.approx(value, rel=1e-3)  # the student moved
    assert [p.name for p in (tmp_path / "adapters").iterdir()] == ["cycle-1"]
    assert result.output == str(tmp_path / "adapters" / "cycle-1")
    assert _job_processes(workdir / "job.json") == []


@pytest.mark.slow
def test_failing_rank_raises_a_clear_error_and_leaves_no_process(tiny_model_dir, tmp_path):
    missing = tmp_path / "no-such-model"
    job = _job(missing, tmp_path / "out", processes=2)
    with pytest.raises(
        JobError,
        match=r"failed on rank \d \(launcher exit code \d+\): FileNotFoundError: "
        rf"model directory {missing} does not exist",
    ) as info:
        run_job(job, workdir=tmp_path / "job")
    assert "the rank's traceback" in str(info.value) and "load_model" in str(info.value)
    assert not (tmp_path / "out").exists()
    assert _job_processes(tmp_path / "job" / "job.json") == []


@pytest.mark.slow
def test_interrupting_the_parent_stops_every_rank(tiny_model_dir, tmp_path, monkeypatch):
    """Ctrl-C in the parent while the ranks are up (loading; the same path as an exception from on_step)."""
    workdir, tail_read = tmp_path / "job", job_module._LineTail.read

    def read(self):
        if all((workdir / f"rank-{rank}.pid").exists() for rank in (0, 1)):
            raise KeyboardInterrupt
        return tail_read(self)

    monkeypatch.setattr(job_module._LineTail, "read", read)
    with pytest.raises(KeyboardInterrupt):
        run_job(_job(tiny_model_dir, tmp_path / "out", processes=2), workdir=workdir)
    assert _job_processes(workdir / "job.json") == []
    assert not (tmp_path / "out").exists()


def test_a_rank_divergence_comes_back_as_divergence_error(tmp_path):
    """The parent's side of the error files a failing rank writes (the rank's side runs in the test above)."""
    (tmp_path / "output.log").write_text("Traceback ...\nDivergenceError: step 0: loss 3 exceeds ...\n")
    for rank, (kind, when) in enumerate([("RuntimeError", 2.0), ("DivergenceError", 1.0)]):
        (tmp_path / f"error-{rank}.json").write_text(
            json.dumps(
                {"rank": rank, "type": kind, "message": f"{kind} on rank {rank}", "time": when, "traceback": "..."}
            )
        )
    error = job_module._failure(tmp_path, 1)
    assert isinstance(error, DivergenceError) and str(error) == "DivergenceError on rank 1"
    (tmp_path / "error-1.json").unlink()
    error = job_module._failure(tmp_path, 1)
    assert isinstance(error, JobError)
    assert "on rank 0 (launcher exit code 1): RuntimeError: RuntimeError on rank 0" in str(error)
    (tmp_path / "error-0.json").unlink()  # killed before it could report: the launcher's output must do
    assert "DivergenceError: step 0" in str(job_module._failure(tmp_path, 1))


def test_batch_shares_are_contiguous_and_cover_the_global_batch_once():
    from types import SimpleNamespace

    from distill.opcd.trainer import OPCDTrainer

    for world in (1, 2, 3, 8):
        for n in (1, 3, 4, 7, 16):
            shares = [OPCDTrainer._share(SimpleNamespace(rank=r, world_size=world), n) for r in range(world)]
            assert [i for s in shares for i in range(n)[s]] == list(range(n)), (world, n)
            sizes = [len(range(n)[s]) for s in shares]
            assert max(sizes) - min(sizes) <= 1, (world, n, sizes)


def test_a_job_trains_in_bfloat16_when_asked_and_keeps_its_adapter_float32(tiny_model_dir, tmp_path, monkeypatch):
    """`weights_dtype: bfloat16` puts the model's weights (and so its activations) in bf16 for the cycle; the LoRA
    weights stay float32, and the adapter differs from the one the float32 run trains on the same data."""
    sets = [["look", "take coin", "go west"]] * 6
    seen = []
    original = job_module.OPCDTrainer

    def recording(model, *args, **kwargs):
        seen.append(next(model.parameters()).dtype)
        return original(model, *args, **kwargs)

    monkeypatch.setattr(job_module, "OPCDTrainer", recording)
    adapters = {}
    for dtype in ("float32", "bfloat16"):
        job = _job(tiny_model_dir, tmp_path / dtype, weights_dtype=dtype).model_copy(
            update={"train_choices": sets, "contexts": LESSON}
        )
        result = run_job(job)
        assert all(torch.isfinite(torch.tensor(m["loss"])) for m in result.steps)
        adapters[dtype] = load_file(str(tmp_path / dtype / "adapter_model.safetensors"))
    assert seen == [torch.float32, torch.bfloat16]
    assert {w.dtype for w in adapters["bfloat16"].values()} == {torch.float32}
    assert any(not torch.equal(adapters["float32"][k], adapters["bfloat16"][k]) for k in adapters["float32"])
