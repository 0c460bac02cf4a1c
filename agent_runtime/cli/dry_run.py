"""`agent-runtime run --dry-run CONFIG`: what a run would load and train, checked without loading any weights.

A paper config names an 8B model on a GPU; a user writing one on a laptop needs to know, before renting the
GPU, that it validates, that the loop accepts its phases, which checkpoints it would read (and whether they
are on this machine), which teacher would teach and whether its tokenizer is the student's, which tasks each
environment plays, and what a cycle would train. `plan` answers all of that as data and `format_plan` as
text. Nothing is written and no weights are read: models are resolved without converting an alias, Hugging
Face ids are looked up in the local cache, tokenizers (small files) are read only when they are already
local, environments are looked up in the registry without being built (building one can generate games or
download a dataset), and an existing store is opened read-only.

Problems (the run would stop on them) make the command exit 2; notes (what this machine lacks, e.g. the
model is not in the local cache or no CUDA device is visible) do not, since that is what a dry run on a
laptop is for.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from agent_runtime.checkpoints import ALIASES, UnknownModelError, cache_root, resolve_model
from agent_runtime.config import ConfigError, RunConfig
from agent_runtime.phases.promotion import decision_sights


def _model(name: str, notes: list[str], problems: list[str], what: str) -> dict[str, Any]:
    """Where `name` would be loaded from, and whether it is on this machine (no conversion, no download)."""
    if name in ALIASES:
        path = cache_root() / "models" / name
        if (path / "config.json").is_file():
            return {"name": name, "kind": "alias", "path": str(path), "local": True}
        wheel = importlib.util.find_spec(ALIASES[name].package) is not None
        notes.append(
            f"{what} {name}: converted on first use from the {ALIASES[name].package} wheel"
            + ("" if wheel else ", which is not installed (agent-runtime setup)")
        )
        return {"name": name, "kind": "alias", "path": str(path), "local": False}
    try:
        resolved = resolve_model(name)
    except UnknownModelError as exc:
        problems.append(f"{what}: {exc}")
        return {"name": name, "kind": "unknown", "path": None, "local": False}
    if Path(resolved).is_dir():
        return {"name": name, "kind": "path", "path": resolved, "local": True}
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(resolved, "config.json")
    local = isinstance(cached, str)
    if not local:
        notes.append(
            f"{what} {name}: not in the local Hugging Face cache (nothing is downloaded at run time: "
            "put it there first, or give a local path)"
        )
    return {"name": name, "kind": "hub", "path": resolved, "local": local}


def _vocabulary(student: dict, teacher: dict, problems: list[str], notes: list[str]) -> dict[str, Any] | None:
    from distill.opcd.teacher import compare_tokenizers, load_tokenizer

    if not (student["local"] and teacher["local"]):
        notes.append(
            "teacher vocabulary: not checked here (a tokenizer is not on this machine); a cycle checks it "
            "before training and refuses a teacher whose tokenizer differs"
        )
        return None
    check = compare_tokenizers(load_tokenizer(student["path"]), load_tokenizer(teacher["path"]))
    if not check.same:
        problems.append(f"opcd.teacher.model: does not share the student's tokenizer: {'; '.join(check.differences)}")
    return check.as_dict()


def _envs(config: RunConfig, problems: list[str], notes: list[str]) -> list[dict[str, Any]]:
    import environments

    known = {(r.as_dict() if hasattr(r, "as_dict") else dict(r))["id"] for r in environments.list_envs()}
    n, seed = config.evaluation.episodes_per_env, config.evaluation.seed
    out = []
    entries = [("play", e) for e in config.envs] + [("retention", e) for e in config.opcd.retention_envs]
    for role, entry in entries:
        if ":" in entry.id:
            source = "code reference, imported when the run starts"
        elif entry.id in known:
            source = "registered"
        else:
            source = "unknown"
            problems.append(f"environment {entry.id!r} is not registered; known: {', '.join(sorted(known))}")
        games = config.opcd.validation_games if config.opcd.enabled else 0
        decision = (
            (
                f"; a cycle's promotion plays the first {games} tasks of the {config.opcd.validation_split} split, "
                "parent and adapter"
            )
            if games
            else ""
        )
        splits = (
            (
                f"PLAY draws from the train split (weight {entry.weight:g}); EVALUATE plays the first {n} "
                f"tasks of the eval split, seeds {seed}..{seed + n - 1}{decision}"
            )
            if role == "play"
            else (f"retention check: the first {config.opcd.eval_episodes or n} tasks of the eval split, no lessons")
        )
        for key, value in entry.kwargs.items():  # a data file the environment reads when it is made
            if (
                (key == "path" or key.endswith("_path"))
                and isinstance(value, str)
                and not Path(value).expanduser().exists()
            ):
                notes.append(
                    f"{entry.id}: {key} {value} is not on this machine (the environment would stop on it; "
                    "the config says where the file comes from)"
                )
        out.append(
            {
                "id": entry.id,
                "role": role,
                "source": source,
                "max_steps": entry.max_steps,
                "kwargs": entry.kwargs,
                "splits": splits,
            }
        )
    return out


def _start_adapter(config: RunConfig, workdir: Path, resume: bool, problems: list[str]) -> str:
    """The adapter the run would act with first: the config's (a new run), or the stored run's (--resume, or a run
    of that name that has not played); a run of that name that has played, without --resume, is a problem."""
    fresh = f"adapter {config.model.adapter}" if config.model.adapter else "the base model (no adapter)"
    db = workdir / "memory.db"
    if config.memory.url:
        return fresh + (
            "; --resume: the stored run's active adapter (a dry run does not open memory.url)" if resume else ""
        )
    if not db.is_file():
        return fresh + ("; --resume: there is no store in the workdir yet" if resume else "")
    from agent_runtime.run.names import episodes_played
    from memory import ExperienceStore

    with ExperienceStore.open(db, read_only=True) as store:
        run = store.find_run(config.name)
        active = store.active_adapter(run.id) if run else None
        played = episodes_played(store, run) if run else 0
    if run is None:
        return fresh
    stored = f"adapter {active.name} ({active.path})" if active else "the base model (no adapter promoted yet)"
    if resume or not played:  # a run that has not played is continued without --resume too (`run.names`)
        return f"{stored}, continuing run {run.id}"
    episodes = f"{played} episode{'s' if played != 1 else ''}"
    problems.append(
        f"the workdir's run {run.id} ({run.name!r}) has played {episodes} and a second run of that name is never "
        f"started: --resume continues it (acting with {stored})"
    )
    return fresh


def _opcd(config: RunConfig, problems: list[str], notes: list[str]) -> dict[str, Any]:
    from agent_runtime.phases.system_prompt import load_context

    o, t = config.opcd, config.opcd.trainer
    trained = (
        "all weights (full fine-tune)" if t.full_finetune else f"a LoRA adapter, r {t.lora_r}, alpha {t.lora_alpha:g}"
    )
    out: dict[str, Any] = {
        "enabled": o.enabled,
        "consolidate_every": o.consolidate_every,
        "recent_episodes": o.recent_episodes,
        "max_prompts": o.max_prompts,
        "trains": trained,
        "trainer": {
            k: getattr(t, k)
            for k in (
                "objective",
                "lr",
                "k",
                "temperature",
                "steps",
                "batch_size",
                "max_new_tokens",
                "processes",
                "sampler",
            )
        },
        "kind": "system_prompt" if o.context else "lessons",
    }
    if o.context is not None:
        if o.context.file and not Path(o.context.file).expanduser().is_file():
            notes.append(
                f"opcd.context.file: {o.context.file} is not on this machine (a cycle would stop on it; "
                "the config says where the file comes from)"
            )
            out["context"] = {"source": o.context.file, "sha256": None, "chars": None}
        else:
            try:
                context = load_context(o.context)
                out["context"] = {"source": context.source, "sha256": context.sha256, "chars": len(context.text)}
            except ConfigError as exc:
                problems.append(str(exc))
        if o.context.prompts:
            out["prompts"] = o.context.prompts
            if not Path(o.context.prompts).expanduser().is_file():
                notes.append(
                    f"opcd.context.prompts: {o.context.prompts} is not on this machine (a JSONL prompt file; "
                    "the config says how to make it)"
                )
        else:
            out["prompts"] = f"the per-turn prompts of the run's {o.recent_episodes} most recent episodes"
    return out


def plan(config: RunConfig, workdir: Path, *, resume: bool = False) -> dict[str, Any]:
    """Everything `run` would load and train for `config`, with the problems that would stop it."""
    import torch

    from agent_runtime.run.loop import check_phases

    problems: list[str] = []
    notes: list[str] = []
    try:
        check_phases(config)
    except Exception as exc:  # noqa: BLE001 - every refusal of the loop is a problem to report, whatever its type
        problems.append(str(exc))
    model = config.model
    if model.backend in ("transformers", "vllm"):
        student = _model(model.name, notes, problems, "model")
    else:  # the scripted policy, or a chat model served elsewhere: no checkpoint is loaded here
        student = {"name": model.name, "kind": model.backend, "path": None, "local": False}
    devices = [model.device] + (
        [config.opcd.teacher.device] if config.opcd.teacher and config.opcd.teacher.device else []
    )
    if any(d.startswith("cuda") for d in devices) and not torch.cuda.is_available():
        notes.append("no CUDA device is visible here: the run needs one")
    if model.backend == "vllm" and importlib.util.find_spec("vllm") is None:
        notes.append("backend vllm: vLLM is not installed here (the `gpu` extra)")
    teacher: dict[str, Any] = {
        "separate": False,
        "what": "the start-of-cycle policy (the parent adapter, or the base model)",
    }
    if config.opcd.teacher is not None:
        t = config.opcd.teacher
        teacher = {
            "separate": True,
            **_model(t.model, notes, problems, "opcd.teacher.model"),
            "adapter": t.adapter,
            "device": t.device or f"{model.device} (the student's)",
        }
        teacher["vocabulary"] = _vocabulary(student, teacher, problems, notes)
    lessons = config.lessons
    return {
        "name": config.name,
        "seed": config.seed,
        "workdir": str(workdir),
        "model": {
            **student,
            "backend": model.backend,
            "device": model.device,
            "dtype": model.dtype,
            "max_new_tokens": model.max_new_tokens,
            "temperature": model.temperature,
        },
        "start_adapter": _start_adapter(config, workdir, resume, problems),
        "teacher": teacher,
        "envs": _envs(config, problems, notes),
        "lessons": {
            "enabled": lessons.enabled,
            "extract_every": lessons.extract_every,
            "pools": lessons.pools,
            "budget_tokens": lessons.budget_tokens,
            "seed_lessons": len(lessons.seed),
            "extractor": lessons.extractor,
            "method": lessons.method,
            "tried_on": lessons.gate_episodes,
            "tried_split": lessons.trial_split,
            "gate_split": lessons.gate_split,
        },
        "decisions": [{"line": line, "warning": warning} for line, warning in decision_sights(config)],
        "opcd": _opcd(config, problems, notes),
        "curriculum": None
        if config.curriculum is None
        else {
            "phases": [
                {"name": ph.label(), "envs": ph.envs, "episodes": ph.episodes} for ph in config.curriculum.phases
            ],
            "eval_episodes": config.curriculum.eval_episodes,
        },
        "problems": problems,
        "notes": notes,
    }


def format_plan(p: dict[str, Any], source: str) -> str:
    """The plan as the lines `run --dry-run` prints."""
    m, o, t = p["model"], p["opcd"], p["opcd"]["trainer"]
    where = (
        m["path"] + ("" if m["local"] else " (not on this machine)")
        if m["path"]
        else f"no checkpoint (backend {m['backend']})"
    )
    lines = [
        f"dry run of {source}: nothing loaded, nothing written",
        f"run         {p['name']} (seed {p['seed']}), workdir {p['workdir']}",
        f"model       {m['name']} -> {where}",
        (
            f"            backend {m['backend']}, device {m['device']}, dtype {m['dtype']}, "
            f"max_new_tokens {m['max_new_tokens']}, temperature {m['temperature']:g}"
        ),
        f"starts from {p['start_adapter']}",
    ]
    tt = p["teacher"]
    if tt["separate"]:
        vocab = tt["vocabulary"]
        check = (
            "not checked here"
            if vocab is None
            else "same as the student's"
            if vocab["same"]
            else "DIFFERENT from the student's"
        )
        lines.append(
            f"teacher     {tt['name']} -> {tt['path']}{'' if tt['local'] else ' (not on this machine)'}, "
            f"device {tt['device']}, adapter {tt['adapter'] or 'none'}; vocabulary {check}"
        )
    else:
        lines.append(f"teacher     {tt['what']}")
    for e in p["envs"]:
        extra = f", max_steps {e['max_steps']}" if e["max_steps"] else ""
        kwargs = f", kwargs {e['kwargs']}" if e["kwargs"] else ""
        lines.append(f"env         {e['id']} ({e['role']}, {e['source']}{extra}{kwargs})")
        lines.append(f"            {e['splits']}")
    les = p["lessons"]
    found = {
        "model": f"written by {les['extractor']}",
        "evidence": f"induced from won/lost evidence, each tried on {les['tried_on']} {les['tried_split']} games "
        f"and confirmed on {les['tried_on']} {les['gate_split']} games",
        "both": f"written by {les['extractor']} and induced from won/lost evidence (each tried on "
        f"{les['tried_on']} {les['tried_split']} games, confirmed on {les['gate_split']} games)",
    }[les["method"]]
    lines.append(
        f"lessons     on: every {les['extract_every']} episodes, {found}, "
        f"{les['pools']} pools, budget {les['budget_tokens']} tokens, {les['seed_lessons']} seed lessons"
        if les["enabled"]
        else "lessons     off"
    )
    for decision in p["decisions"]:
        lines.append(f"decisions   {'WARNING: ' if decision['warning'] else ''}{decision['line']}")
    what = "the lessons" if o["kind"] == "lessons" else "a system prompt"
    if o.get("context", {}).get("sha256"):
        what += f" ({o['context']['source']}, {o['context']['chars']} chars, sha256 {o['context']['sha256'][:12]})"
    elif "context" in o:
        what += f" ({o['context']['source']}, not on this machine)"
    if o["kind"] == "system_prompt":
        what += f" over {o['prompts']}"
    when = (
        f"a cycle every {o['consolidate_every']} episodes (or now: agent-runtime distill)"
        if o["enabled"]
        else "no cycle in the loop (cycles on demand: agent-runtime distill)"
    )
    lines.append(f"opcd        {when}; distils {what} into {o['trains']}")
    lines.append(
        f"            {t['objective']}, lr {t['lr']:g}, top-k {t['k']}, temperature {t['temperature']:g}, "
        f"{t['steps']} steps x {t['batch_size']} prompts, max_new_tokens {t['max_new_tokens']}, "
        f"{t['processes']} process(es), sampler {t['sampler']}; at most {o['max_prompts']} prompts"
        + (f" from the last {o['recent_episodes']} episodes" if o["kind"] == "lessons" else "")
    )
    if p.get("curriculum"):
        cur = p["curriculum"]
        lines.append(
            f"curriculum  {len(cur['phases'])} phases, each ending with EXTRACT, CONSOLIDATE and an assessment of every "
            f"environment on {cur['eval_episodes']} held-out games (also before the first): the continual matrix"
        )
        lines += [
            f"            phase {i}: {ph['name']}: {ph['episodes']} episodes of {', '.join(ph['envs'])}"
            for i, ph in enumerate(cur["phases"], start=1)
        ]
    lines += [f"note        {n}" for n in p["notes"]]
    lines += [f"PROBLEM     {x}" for x in p["problems"]]
    lines.append(
        "ok: the config is valid and the run would start"
        if not p["problems"]
        else f"{len(p['problems'])} problem(s): the run would not start"
    )
    return "\n".join(lines)
