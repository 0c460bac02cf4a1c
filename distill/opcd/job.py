"""`TrainJob` and `run_job`: one OPCD training run as a self-contained job, in this process or data parallel.

The consolidation cycle needs the same four things from every training run, wherever it happens: the KL of
some prompt sets before training, the training steps as they come (to draw the curves of a long cycle), the
KL after, and the adapter on disk. A `TrainJob` says everything a run needs as plain data (a model
directory, prompts, lesson pools, an `OPCDConfig`), so that it can be written to a JSON file and run by
another process; `run_job` runs it and answers a `JobResult`.

A job with a `teacher` (`distill.opcd.teacher.TeacherSpec`: cross-size distillation) loads that model as the
teacher, after checking that its tokenizer is the student's (`TeacherTokenizerError` otherwise, before any
weights are read); every rank loads its own copy, on its own device unless the spec names one.

With `config.processes == 1` the job runs in the calling process. With N > 1 it is written to a folder and
launched as `python -m torch.distributed.run --standalone --nproc_per_node N -m distill.opcd.job JOB.json`:
every rank loads the model, accelerate's `PartialState` joins the process group and picks the device and
backend (gloo on CPU, NCCL and one GPU per rank on CUDA), and `OPCDTrainer` shares each global batch out
(see its module docstring). The launcher is torch's own rather than `accelerate launch`: on CPU, accelerate
launches several processes only through MPI (`--mpirun_hostfile`) and otherwise starts one; on GPUs its
`--multi_gpu` mode is a wrapper around the same `torch.distributed.run`; and `--standalone` lets the
rendezvous pick a free port where accelerate defaults to 29500, which two jobs on one machine would share.

Rank 0 appends every step's metrics as a JSON line to `steps.jsonl`, which the parent tails and hands to
`on_step` as they arrive; at the end it writes `result.json`. A rank that fails writes `error-<rank>.json`;
the parent raises the first error (a `DivergenceError` as a `DivergenceError`, anything else as a
`JobError` with the tail of the job's output). No trainer outlives the parent: the launcher runs in its own
process group, which is stopped (SIGTERM, then SIGKILL) when the parent raises or is interrupted, the ranks
are killed by the pid files they leave, and each rank exits by itself when the parent process disappears
(kill -9 included).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field, model_validator

from distill.opcd.config import OPCDConfig
from distill.opcd.teacher import TeacherSpec, check_teacher, load_teacher, load_tokenizer
from distill.opcd.trainer import Chat, DivergenceError, OPCDTrainer, PromptContexts
from modelkit.config_base import StrictConfig
from modelkit.weights import base_view, can_share, release_memory

PARENT_PID_ENV = "OPCD_JOB_PARENT_PID"
_STOP_GRACE_SECONDS = 10.0


class JobError(RuntimeError):
    """A training job failed for a reason other than divergence (bad model path, a crash in a rank, ...)."""


class TrainJob(StrictConfig):
    """Everything one training run needs, as data (it round-trips through JSON)."""

    model_config = StrictConfig.model_config | {"protected_namespaces": ()}

    model_path: str
    """A local checkpoint directory (or a Hugging Face id already in the cache: nothing is downloaded)."""
    config: OPCDConfig
    train_prompts: list[Chat]
    contexts: list[str] | str
    """One context for every sample, or the lesson pools (one drawn per sample), as `OPCDTrainer.train`."""
    prompt_contexts: list[list[str]] | None = None
    """Instead of `contexts`: per training prompt, its own pools' contexts (the lessons in scope for the environment
    it came from; `PromptContexts`)."""
    output: str
    """Where the adapter is written (atomically)."""
    parent_adapter: str | None = None
    """The start-of-cycle adapter: the student's starting point, and the teacher unless `teacher` names one."""
    teacher: TeacherSpec | None = None
    """A separate teacher model (cross-size distillation); None: the student's own start-of-cycle policy."""
    kl_sets: dict[str, tuple[list[Chat], list[str] | str]] = Field(default_factory=dict)
    """name -> (prompts, one context per prompt or one for all): held-out KL measured before and after."""
    train_choices: list[list[str]] | None = None
    """One action set per training prompt: the agent acts by choosing, and the choice policy is distilled."""
    kl_choices: dict[str, list[list[str]]] = Field(default_factory=dict)
    """name -> one action set per prompt of that KL set: its KL is then the choice policies' KL."""
    anchor_prompts: list[Chat] = Field(default_factory=list)
    """Prompts of other tasks trained on beside `train_prompts` with no context: there the student is held to the
    start-of-cycle policy (replay against forgetting; `OPCDTrainer.train`'s `anchors`)."""
    anchor_choices: list[list[str]] | None = None
    """One action set per anchor prompt, exactly when `train_choices` is given."""
    metadata: dict[str, Any] = Field(default_factory=dict)
    """Stored with the adapter (`opcd.json`), e.g. cycle and run ids."""
    device: Literal["cpu", "cuda"] = "cpu"
    overwrite: bool = False
    """Replace an adapter already at `output` (a rerun of an interrupted cycle)."""

    @model_validator(mode="after")
    def _one_context_list_per_prompt(self) -> TrainJob:
        if self.prompt_contexts is not None and len(self.prompt_contexts) != len(self.train_prompts):
            raise ValueError(
                f"prompt_contexts holds {len(self.prompt_contexts)} lists for {len(self.train_prompts)} train prompts"
            )
        return self

    @model_validator(mode="after")
    def _anchors_need_own_teacher(self) -> TrainJob:
        if self.anchor_prompts and self.teacher is not None:
            raise ValueError(
                "anchor_prompts hold the student to the start-of-cycle policy; a separate teacher "
                "would teach there instead: drop the anchors or the separate teacher"
            )
        return self


@dataclass
class JobResult:
    kl_before: dict[str, float]
    kl_after: dict[str, float]
    steps: list[dict]
    """The per-step metrics of `OPCDTrainer.step`, in order."""
    output: str
    seconds: float
    validation: list[dict] | None = None
    """{"step", "val_kl"} per measurement on the held-back share of the training prompts (None: no validation)."""
    best_step: int | None = None
    """The step whose adapter was kept (the best validation KL; None: the last step, no validation)."""
    stopped_early: bool = False
    tokens: dict[str, int] = field(default_factory=dict)
    """The trainer's work in tokens (`OPCDTrainer.tokens`, this rank's): `train` through the student with
    gradients, `teacher` through the frozen teacher, `scored` through the student without them (the held-out KL)."""


def load_model(model_path: str):
    """(causal LM, tokenizer) from a local checkpoint, offline; the tokenizer pads with EOS if it has no pad."""
    from transformers import AutoModelForCausalLM

    tokenizer = load_tokenizer(model_path, pad=True)
    return AutoModelForCausalLM.from_pretrained(model_path, local_files_only=True), tokenizer


def execute(
    job: TrainJob,
    on_step: Callable[[dict], None] | None = None,
    device: str | torch.device | None = None,
    *,
    shared_weights: torch.nn.Module | None = None,
) -> JobResult:
    """Run `job` in this process: as the whole job, or as one rank when a process group is initialised.

    `shared_weights`: a model already loaded in this process from `job.model_path` (the acting policy's, adapters
    and all); a LoRA run then trains on a view of its base weights instead of loading a second copy, when the
    dtype and device are the job's (`modelkit.weights.base_view`)."""
    started = time.perf_counter()
    if job.teacher is not None:  # before any weights are read: a teacher that cannot teach fails at once
        check_teacher(job.model_path, job.teacher)
    dtype, target = getattr(torch, job.config.weights_dtype), torch.device(device or job.device)
    if shared_weights is not None and not job.config.full_finetune and can_share(shared_weights, dtype, target):
        model, tokenizer = base_view(shared_weights), load_tokenizer(job.model_path, pad=True)
    else:
        model, tokenizer = load_model(job.model_path)
        model.to(target, dtype=dtype)
    teacher = None
    if job.teacher is not None:
        teacher = load_teacher(
            job.teacher, job.teacher.device if device is None and job.teacher.device else model.device
        )
    cuda = [model.device.index or 0] if model.device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):  # the fresh adapter depends on the config seed alone
        torch.manual_seed(job.config.seed)
        trainer = OPCDTrainer(model, tokenizer, job.config, parent_adapter=job.parent_adapter, teacher_model=teacher)

    def kls() -> dict[str, float]:
        return {
            name: trainer.evaluate_kl(prompts, contexts, job.kl_choices.get(name))
            for name, (prompts, contexts) in job.kl_sets.items()
        }

    kl_before = kls()
    contexts = job.contexts
    if job.prompt_contexts is not None:
        contexts = PromptContexts(job.train_prompts, job.prompt_contexts)
    steps = trainer.train(
        job.train_prompts,
        contexts,
        on_step=on_step,
        choices=job.train_choices,
        anchors=job.anchor_prompts,
        anchor_choices=job.anchor_choices,
    )
    kl_after = kls()
    chosen = {
        "validation": trainer.validation or None,
        "best_step": trainer.best["step"] if trainer.best else None,
        "stopped_early": trainer.stopped_early,
    }
    trainer.save_adapter(job.output, overwrite=job.overwrite, metadata={**job.metadata, **chosen})
    seconds = time.perf_counter() - started
    return JobResult(kl_before, kl_after, steps, job.output, seconds, **chosen, tokens=dict(trainer.tokens))


def run_job(
    job: TrainJob,
    on_step: Callable[[dict], None] | None = None,
    *,
    workdir: str | Path | None = None,
    shared_weights: torch.nn.Module | None = None,
) -> JobResult:
    """Run `job` (in this process, or as `job.config.processes` data-parallel ranks) and return its result.

    `on_step(metrics)` is called in this process after every optimizer step, as the steps happen; raising
    from it stops the job. A diverged run raises `DivergenceError`, any other failure `JobError`.
    `workdir` keeps the launched job's files (job.json, steps.jsonl, output.log) instead of a temporary
    folder that is removed afterwards. `shared_weights`: see `execute` (in this process only; ranks load their
    own).
    """
    processes = job.config.processes
    if processes == 1:
        try:
            return execute(job, on_step, shared_weights=shared_weights)
        finally:
            release_memory()  # the trainer, its model and its batches sit in reference cycles
    if job.device == "cuda" and torch.cuda.device_count() < processes:
        raise ValueError(f"processes={processes} needs one GPU per process; {torch.cuda.device_count()} visible")
    folder = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="opcd-job-"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        return _launch(job, on_step, folder)
    finally:
        if workdir is None:
            import shutil

            shutil.rmtree(folder, ignore_errors=True)


def _launch(job: TrainJob, on_step: Callable[[dict], None] | None, folder: Path) -> JobResult:
    processes = job.config.processes
    job_file = folder / "job.json"
    job_file.write_text(job.model_dump_json())
    for stale in [
        *folder.glob("error-*.json"),
        *folder.glob("rank-*.pid"),
        folder / "steps.jsonl",
        folder / "result.json",
    ]:
        stale.unlink(missing_ok=True)
    root = str(Path(__file__).resolve().parents[2])
    env = {
        **os.environ,
        PARENT_PID_ENV: str(os.getpid()),
        "PYTHONPATH": os.pathsep.join(p for p in [root, os.environ.get("PYTHONPATH")] if p),
    }
    if job.device == "cpu":  # torchrun would pin every rank to one thread
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // processes)))
        if sys.platform.startswith("linux"):  # one machine: gloo on loopback, whatever the hostname resolves to
            env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes",
        "1",
        "--nproc_per_node",
        str(processes),
        "--max_restarts",
        "0",
        "-m",
        "distill.opcd.job",
        str(job_file),
    ]
    with open(folder / "output.log", "wb") as log:
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            tail = _LineTail(folder / "steps.jsonl")
            while True:
                code = process.poll()  # before reading, so that the last read after the exit sees every line
                for metrics in tail.read():
                    if on_step is not None:
                        on_step(metrics)
                if code is not None:
                    break
                time.sleep(0.1)
        except BaseException:
            _stop(process)
            raise
        finally:
            _kill_ranks(folder, job_file)
    if process.returncode != 0:
        raise _failure(folder, process.returncode)
    return JobResult(**json.loads((folder / "result.json").read_text()))


class _LineTail:
    """The complete JSON lines appended to a file since the last read."""

    def __init__(self, path: Path):
        self.path, self.offset = path, 0

    def read(self) -> list[dict]:
        if not self.path.exists():
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        return [json.loads(line) for line in complete.splitlines() if line.strip()]


def _stop(process: subprocess.Popen) -> None:
    """Stop the launcher's process group: SIGTERM (torchrun passes it on to the ranks), then SIGKILL."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=_STOP_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    except ProcessLookupError:
        pass


def _kill_ranks(folder: Path, job_file: Path) -> None:
    """Kill ranks still alive (torchrun starts each in its own session, out of reach of the group kill);
    a pid is only trusted while its command line still names this job's file."""
    import psutil

    for pid_file in folder.glob("rank-*.pid"):
        try:
            rank = psutil.Process(int(pid_file.read_text()))
            if str(job_file) in rank.cmdline():
                rank.kill()
                rank.wait(timeout=_STOP_GRACE_SECONDS)
        except (ValueError, psutil.Error):
            continue


def _failure(folder: Path, code: int) -> Exception:
    """The exception the parent raises for a failed job: the first error a rank reported, with the output."""
    reports = []
    for path in folder.glob("error-*.json"):
        try:
            reports.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    reports.sort(key=lambda r: r["time"])
    diverged = [r for r in reports if r["type"] == "DivergenceError"]
    if diverged:
        return DivergenceError(diverged[0]["message"])
    if reports:  # the rank's own traceback says more than the launcher's summary of it
        first = reports[0]
        tail = "\n".join(first["traceback"].strip().splitlines()[-20:])
        return JobError(
            f"OPCD training job failed on rank {first['rank']} (launcher exit code {code}): "
            f"{first['type']}: {first['message']}\n--- the rank's traceback ---\n{tail}"
        )
    log = (folder / "output.log").read_text(errors="replace") if (folder / "output.log").exists() else ""
    tail = "\n".join(log.strip().splitlines()[-30:])
    return JobError(f"OPCD training job failed (launcher exit code {code})\n--- last lines of its output ---\n{tail}")


# -- the rank side -----------------------------------------------------------------------------------------
def _watch_parent(pid: int) -> None:
    """Exit this rank when the process that launched the job is gone (even after a kill -9 of it)."""

    def watch() -> None:
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                os._exit(1)
            except PermissionError:
                pass
            time.sleep(1.0)

    if pid:
        threading.Thread(target=watch, name="opcd-parent-watch", daemon=True).start()


def _write_json(path: Path, data: dict) -> None:
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(data))
    partial.replace(path)


def main(argv: list[str] | None = None) -> int:
    """One rank of a launched job: `python -m distill.opcd.job JOB.json` under torch.distributed.run."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m torch.distributed.run ... -m distill.opcd.job JOB.json", file=sys.stderr)
        return 2
    job_file = Path(argv[0])
    folder, rank = job_file.parent, int(os.environ.get("RANK", "0"))
    pid_file = folder / f"rank-{rank}.pid"
    pid_file.with_suffix(".partial").write_text(str(os.getpid()))
    pid_file.with_suffix(".partial").replace(pid_file)  # never seen half-written
    _watch_parent(int(os.environ.get(PARENT_PID_ENV, "0")))
    try:
        from accelerate import PartialState

        job = TrainJob.model_validate_json(job_file.read_text())
        state = PartialState(cpu=job.device == "cpu")

        def on_step(metrics: dict) -> None:
            with open(folder / "steps.jsonl", "a") as steps:  # closed per line: the parent sees it at once
                steps.write(json.dumps(metrics) + "\n")

        result = execute(job, on_step if state.is_main_process else None, state.device)
        if state.is_main_process:
            _write_json(folder / "result.json", asdict(result))
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    except BaseException as exc:
        _write_json(
            folder / f"error-{rank}.json",
            {
                "rank": rank,
                "type": type(exc).__name__,
                "message": str(exc),
                "time": time.time(),
                "traceback": traceback.format_exc(),
            },
        )
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
