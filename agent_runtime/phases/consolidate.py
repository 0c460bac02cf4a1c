"""One OPCD cycle as the loop runs it: CONSOLIDATE -> EVALUATE -> PROMOTE | ROLLBACK (`run_cycle`, in numbered steps).

1. CONSOLIDATE: the prompts are the run's recent decisions rebuilt without lessons
   (`agent_runtime.phases.turn_prompts`), a tenth held out; the context is the live lesson set (or one system prompt,
   `opcd.context`). The trainer (`distill.opcd.run_job`) fits a LoRA adapter on top of the run's adapter so that the
   student without the context matches the teacher with it (the choice policy in choice mode); curves go into the
   cycle row as it trains. A diverging loss is a ROLLBACK.
2. EVALUATE (`evaluate_cycle`): on the held-out tasks with fixed seeds, random play, the parent and the student
   with and without the lessons, retention on environments the cycle did not train on, and the decision's
   validation games.
3. PROMOTE or ROLLBACK: the rules are in `agent_runtime.phases.promotion`, and only there; lessons the student
   internalised leave the context. The outcome and the run's cursor move are one transaction.

A separate teacher (`opcd.teacher`) replaces the parent as the model with the context; EVALUATE's "teacher" rows
stay the parent (the acting policy the student must not fall below), and the cycle row says which is which.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent_runtime.checkpoints import resolve_model
from agent_runtime.config import ConfigError, EnvEntry, RunConfig
from agent_runtime.episode.build import build_prompt_builders
from agent_runtime.evaluation import EvalResult
from agent_runtime.llm import making_room, training_device
from agent_runtime.llm.base import acting
from agent_runtime.phases.cycle import Cycle, lesson_pools
from agent_runtime.phases.cycle_evaluation import evaluate_cycle, rates_and_games
from agent_runtime.phases.probe import ensure_reference
from agent_runtime.phases.promotion import CycleDecision, changed_meanwhile, decide_cycle
from agent_runtime.phases.system_prompt import SystemPrompt, load_context, load_prompts
from agent_runtime.phases.turn_prompts import Decision, choose_prompts, recent_decisions, rehearsal, turn_prefixes
from agent_runtime.state import Run
from agent_runtime.state.cursor import CursorMove
from agent_runtime.state.profile import count_work, profiled
from distill.lessons import live_lessons, render_lessons
from distill.lessons.versions import create_version, live_version
from distill.opcd import (
    DivergenceError,
    TeacherSpec,
    TeacherTokenizerError,
    TrainJob,
    remove_partial_writes,
    run_job,
)
from distill.opcd.teacher import check_teacher
from memory import ExperienceStore
from modelkit.fingerprint import fingerprint_files

log = logging.getLogger("agent_runtime.phases.consolidate")


@dataclass
class CycleReport:
    """What one call of `run_cycle` did: "promoted", "rolled_back", or "skipped" (nothing to consolidate: no
    cycle row, `cycle_id` None)."""

    cycle_id: int | None
    status: str  # promoted, rolled_back, skipped
    reasons: list[str] = field(default_factory=list)
    adapter_id: int | None = None
    consolidated: list[int] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        if self.status == "skipped":
            return f"CONSOLIDATE: {'; '.join(self.reasons)}; nothing to consolidate"
        head = f"OPCD cycle {self.cycle_id}: {self.status}"
        if self.metrics.get("kind") == "system_prompt":
            head += f" (system prompt {self.metrics['context_sha256'][:12]})"
        if (self.metrics.get("teacher") or {}).get("separate"):
            head += f" (teacher {self.metrics['teacher']['model']})"
        evals = self.metrics.get("evaluation", {})
        shown = ", ".join(f"{k} {v:.0%}" for k, v in evals.items())
        kl = self.metrics.get("heldout_kl")
        kl_s = f"; held-out KL {kl['before']:.3f} -> {kl['after']:.3f}" if kl else ""
        extra = f"; {len(self.consolidated)} lessons consolidated" if self.consolidated else ""
        return f"{head}{kl_s}; {shown}{extra}" + (f" ({'; '.join(self.reasons)})" if self.reasons else "")


def anchor_decisions(run: Run, backend, envs: list[EnvEntry], episodes: int, *, choice_mode: bool) -> list[Decision]:
    """The anchor prompts (`opcd.anchor_envs`): every turn of `episodes` train tasks of each env, played by the
    acting policy as it is (the parent) greedily without lessons, rebuilt as prompts; only the choice-mode turns
    when the cycle distils the choice policy, only the free ones otherwise. The episodes are not stored: they are
    the parent's behaviour to keep, not experience."""
    config = run.config.model_copy(update={"envs": list(envs)})
    specs, _, _ = run.pool.envs(config, run.workdir, "train")  # built once; the evaluation below lends from the pool
    builders = {s.env_id: b for s, b in zip(specs, build_prompt_builders(config, specs, backend))}
    out: list[Decision] = []
    run.evaluate(
        backend,
        envs=envs,
        lessons=[],
        episodes_per_env=episodes,
        split="train",
        on_record=lambda record: out.extend(turn_prefixes(builders[record.env_id], record.steps, env_id=record.env_id)),
    )
    return [d for d in out if bool(d.choices) == choice_mode]


def cycle_teacher(config: RunConfig, model_path: str) -> tuple[TeacherSpec | None, dict[str, Any]]:
    """The cycle's separate teacher (None: the start-of-cycle policy teaches) and its record for the cycle row;
    a teacher whose tokenizer is not the student's (`model_path`, the run's resolved model) is a ConfigError
    here, before anything is trained."""
    if config.opcd.teacher is None:
        return None, {
            "separate": False,
            "model": config.model.name,
            "what": "the start-of-cycle policy: the parent adapter, or the base model",
        }
    t = config.opcd.teacher
    spec = t.model_copy(update={"model": resolve_model(t.model)})  # the job loads the resolved checkpoint
    try:
        check = check_teacher(model_path, spec)
    except TeacherTokenizerError as exc:
        raise ConfigError(f"opcd.teacher.model: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"opcd.teacher.model: cannot read the tokenizer of {t.model!r} ({exc})") from None
    return spec, {
        "separate": True,
        "model": t.model,
        "path": spec.model,
        "adapter": t.adapter,
        "device": t.device,
        "vocabulary": check.as_dict(),
    }


def _conditions(config: RunConfig, parent, teacher: dict, system: SystemPrompt | None) -> dict[str, str]:
    """What each evaluated condition is in this cycle (a separate teacher or a system prompt change it)."""
    acting = f"{config.model.name} + adapter {parent.name}" if parent else f"{config.model.name} (no adapter)"
    shown = "the system prompt" if system else "the lessons"
    out = {
        "teacher_with_lessons": f"the parent, {acting}, with {shown}",
        "teacher_without_lessons": f"the parent, {acting}, without {shown}",
        "student_with_lessons": f"the cycle's adapter with {shown}",
        "student_without_lessons": f"the cycle's adapter without {shown}",
    }
    if teacher["separate"]:
        out["teacher"] = (
            f"{teacher['model']} taught this cycle with {shown}; the teacher_* conditions are the "
            "parent (the acting policy before the cycle), not that model, which is not evaluated"
        )
    return out


def _rate(results: list[EvalResult]) -> float:
    n = sum(r.n for r in results)
    return sum(r.successes for r in results) / n if n else 0.0


def run_cycle(run: Run, backend, *, progress=None, finish: CursorMove | None = None) -> CycleReport:
    """One whole cycle of `run` (its `opcd:` settings), stored with its outcome and reasons (status "skipped" when
    there are no lessons to consolidate). `backend` acts with adapters (checked where it was built:
    `agent_runtime.llm.check_capabilities`); it acts as it did before once the cycle is over, whatever the outcome (the
    caller switches to a promoted adapter).

    The cycle's outcome (its evaluations, the promotion or rollback, the lesson set without what it
    consolidated) and `finish`, the run's cursor move, are written in one transaction: a process killed after
    a promotion never starts a second cycle on resume. The cycle row itself (written at the start, its curves
    step by step) is the cycle's progress, shown while it trains; a cycle found still running was
    interrupted and is rolled back (`roll_back_interrupted`). After a promotion the adapter probe's reference
    is computed here, where the cycle ran (`agent_runtime.phases.probe.ensure_reference`)."""

    config, store, run_id = run.config, run.store, run.id

    def move_cursor(report: CycleReport) -> CycleReport:  # called inside the transaction of the outcome
        if finish is not None:
            finish.apply(store, run_id, skipped=report.status == "skipped")
        return report

    # 1. set-up: the lessons (or system prompt) to distil, the cycle row
    cycle = start_cycle(run)
    if cycle is None:
        with store.transaction():
            return move_cursor(CycleReport(None, "skipped", ["no live lessons"]))
    # 2. the prompts: the run's recent decisions, a tenth held out, and the replayed ones
    prompts = gather_prompts(run, backend, cycle)
    path = run.workdir / "adapters" / f"cycle-{cycle.cycle_id}"
    # 3. CONSOLIDATE: train the student
    job = train_job(
        run,
        cycle,
        prompts.train,
        prompts.heldout,
        prompts.per_lesson,
        path,
        choice_mode=prompts.choice_mode,
        device=training_device(config, backend),
        anchors=prompts.anchors,
    )
    try:
        with profiled("CONSOLIDATE: train"):
            result = _train(store, cycle.cycle_id, job, backend, progress)
            count_work(**{f"{name}_tokens": n for name, n in result.tokens.items()})
    except DivergenceError as exc:
        with store.transaction():
            store.rollback_cycle(cycle.cycle_id, error=str(exc))
            return move_cursor(CycleReport(cycle.cycle_id, "rolled_back", [str(exc)]))
    _record_training(run, cycle, prompts, result, path)
    # 4. EVALUATE every condition, then PROMOTE or ROLLBACK with the cursor's move
    with profiled("CONSOLIDATE: evaluate"):
        evals = evaluate_cycle(run, backend, cycle)
    cycle.metrics["evaluation"] = {k: _rate(v) for k, v in evals.items()}
    with store.transaction():
        report = move_cursor(_decide(run, cycle, evals))
    # 5. the probe's reference for a promoted adapter, where it was trained
    if report.status == "promoted":
        with profiled("PROMOTE: probe"), making_room(backend):
            ensure_reference(run, store.get_adapter(cycle.adapter_id), backend, count=count_work)
    return report


@dataclass
class CyclePrompts:
    """What a cycle trains on and measures with: its taught prompts split into train and held-out ones, each
    lesson's own prompts for its KL, and the anchors (the run's replayed past decisions, and `opcd.anchor_envs`'
    played ones), where the student is held to its parent."""

    train: list[Decision]
    heldout: list[Decision]
    per_lesson: dict[int, list[Decision]]
    anchors: list[Decision]
    replayed: int  # how many of the anchors are the run's own replayed decisions
    choice_mode: bool


def gather_prompts(run: Run, backend, cycle: Cycle) -> CyclePrompts:
    """The cycle's prompts (`CyclePrompts`): the run's recent decisions in scope of a lesson, a tenth held out; the
    run's past decisions of environments no lesson is in scope for, replayed; stored with the cycle row."""
    store, opcd = run.store, run.config.opcd
    decisions, replay = cycle.taught(
        cycle_prompts(run, backend, cycle)
        + rehearsal(run, backend, cycle.cycle_id, skip=bool(cycle.system or cycle.prompt_file))
    )
    if not decisions:
        decisions, replay = replay, []  # no prompt of an environment in scope: taught as before scopes
    if cycle.teacher_spec is not None:
        replay = []  # a separate teacher would teach there, not hold the parent's policy
    choice_mode = any(d.choices for d in decisions)
    store.update_cycle(cycle.cycle_id, episode_ids=sorted({e for d in decisions for e in d.episode_ids}))
    heldout, train = split_heldout(decisions)
    adapters_dir = run.workdir / "adapters"
    if adapters_dir.exists():
        remove_partial_writes(adapters_dir)  # what a killed cycle left half-written
    per_lesson = {x.id: _lesson_prompts(x, decisions, heldout) for x in cycle.lessons}
    anchors = [d for d in replay if bool(d.choices) == choice_mode]  # the run's own past decisions, replayed
    replayed = len(anchors)
    if opcd.anchor_envs:
        with profiled("CONSOLIDATE: anchor play"), acting(backend, cycle.parent):
            anchors += anchor_decisions(run, backend, opcd.anchor_envs, opcd.anchor_episodes, choice_mode=choice_mode)
    return CyclePrompts(train, heldout, per_lesson, anchors, replayed, choice_mode)


def _record_training(run: Run, cycle: Cycle, prompts: CyclePrompts, result, path: Path) -> None:
    """The trained adapter and the cycle's KL and training metrics, on `cycle` and in the store."""
    config, store = run.config, run.store
    cycle.kl = (result.kl_before["heldout"], result.kl_after["heldout"])
    cycle.lesson_kl = (
        {i: result.kl_before[f"lesson:{i}"] for i in prompts.per_lesson},
        {i: result.kl_after[f"lesson:{i}"] for i in prompts.per_lesson},
    )
    parent = cycle.parent
    cycle.adapter_id = store.add_adapter(
        f"cycle-{cycle.cycle_id}",
        str(path),
        run_id=run.id,
        parent_id=parent.id if parent else None,
        base_model=config.model.name,
        fingerprint=fingerprint_files(path),
    )
    cycle.metrics = cycle_metrics(
        config,
        cycle,
        prompts=len(prompts.train),
        heldout=len(prompts.heldout),
        choice_mode=prompts.choice_mode,
        train_seconds=result.seconds,
    )
    if config.opcd.anchor_envs or prompts.replayed:
        cycle.metrics["anchor_prompts"] = len(prompts.anchors)
        cycle.metrics["replay_prompts"] = prompts.replayed
    cycle.metrics["training"] = {
        "steps": len(result.steps),
        "best_step": result.best_step,
        "stopped_early": result.stopped_early,
        "validation": result.validation,
    }
    store.update_cycle(cycle.cycle_id, adapter_id=cycle.adapter_id, metrics=cycle.metrics)


def start_cycle(run: Run) -> Cycle | None:
    """The cycle's set-up and its row, written as it starts (None: no live lessons and no system prompt)."""
    config, store, run_id, opcd = run.config, run.store, run.id, run.config.opcd
    live, lessons = live_lessons(store, run_id)
    system = load_context(opcd.context) if opcd.context is not None else None
    if system is None and not lessons:
        return None
    # checked against the held-out tasks before the cycle starts (PromptFileLeakError names the line)
    prompt_file = load_prompts(opcd.context.prompts, held=run.held) if system and opcd.context.prompts else None
    teacher_spec, teacher = cycle_teacher(config, run.model_path)
    parent = store.active_adapter(run_id)
    kind = "system_prompt" if system else "lessons"
    cycle_config = {
        "opcd": opcd.model_dump(mode="json"),
        "kind": kind,
        "teacher": teacher,
        **({"context": system.record()} if system else {}),
    }
    cycle_id = store.start_cycle(
        run_id,
        cycle_config,
        lesson_set_version=None if system else live.version,
        base_adapter_id=parent.id if parent else None,
    )
    if system:  # no lesson set is involved: none is shown, recorded or consolidated
        live, lessons, contexts = None, [], [system.text]
    else:
        contexts = [render_lessons([x.text for x in lessons if x.pool == p]) for p in lesson_pools(lessons)]
    cycle = Cycle(cycle_id, kind, parent, live, lessons, system, contexts, teacher_spec, teacher, prompt_file)
    cycle.families = run.families
    cycle.budget = None if system else run.lesson_budget  # the teacher's context: what PLAY's prompt held
    return cycle


def cycle_prompts(run: Run, backend, cycle: Cycle) -> list[Decision]:
    """The decisions the cycle trains and measures on: a prompt file's, or the run's recent ones."""
    opcd = run.config.opcd
    if cycle.prompt_file is not None:
        decisions = [Decision(chat, []) for chat in cycle.prompt_file]
    else:
        decisions = recent_decisions(run, backend)
    return choose_prompts(decisions, cycle.cycle_id, opcd.max_prompts)


def split_heldout(decisions: list[Decision]) -> tuple[list[Decision], list[Decision]]:
    """A tenth of the decisions (at least one) held out to measure the KL on; the rest to train on (all of
    them when nothing else is left)."""
    held = max(1, len(decisions) // 10)
    return decisions[:held], decisions[held:] or decisions


def train_job(
    run: Run,
    cycle: Cycle,
    train: list[Decision],
    heldout: list[Decision],
    per_lesson: dict[int, list[Decision]],
    path: Path,
    *,
    choice_mode: bool,
    device: str,
    anchors: list[Decision] = (),
) -> TrainJob:
    """The trainer's job: the student (the parent's adapter on the run's model) learns on `train` (the choice
    policy over each decision's action set in `choice_mode`), and keeps the parent's policy on `anchors`; the KL
    to the teacher is measured on the held-out decisions and on each lesson's own ones."""
    scoped = any(cycle.contexts_for(d) != cycle.contexts for d in [*train, *heldout])
    kl_sets = {
        "heldout": (
            [d.chat for d in heldout],
            [cycle.contexts_for(d)[0] for d in heldout] if scoped else cycle.contexts[0],
        ),
        **{
            f"lesson:{i}": ([d.chat for d in ds], render_lessons([_text(cycle.lessons, i)]))
            for i, ds in per_lesson.items()
        },
    }
    kl_choices = {}
    if choice_mode:
        kl_choices = {
            "heldout": [d.choices for d in heldout],
            **{f"lesson:{i}": [d.choices for d in ds] for i, ds in per_lesson.items()},
        }
    parent = cycle.parent
    return TrainJob(
        model_path=run.model_path,
        config=run.config.opcd.trainer,
        train_prompts=[d.chat for d in train],
        contexts=cycle.system.text if cycle.system else cycle.contexts,
        prompt_contexts=[cycle.contexts_for(d) for d in train] if scoped else None,
        output=str(path),
        parent_adapter=parent.path if parent else None,
        teacher=cycle.teacher_spec,
        kl_sets=kl_sets,
        kl_choices=kl_choices,
        train_choices=[d.choices for d in train] if choice_mode else None,
        anchor_prompts=[d.chat for d in anchors],
        anchor_choices=[d.choices for d in anchors] if choice_mode and anchors else None,
        metadata={"cycle_id": cycle.cycle_id, "run_id": run.id, "kind": cycle.kind, "teacher": cycle.teacher},
        device=device,
        overwrite=True,
    )


def _train(store: ExperienceStore, cycle_id: int, job: TrainJob, backend, progress):
    """Train the job (the acting engine makes room meanwhile), each step's loss and KL into the cycle row."""

    def on_step(m: dict) -> None:
        point = {"loss": m["loss"], "kl": m["kl_estimate"], "grad_norm": m["grad_norm"], "lr": m["lr"]}
        if m.get("val_kl") is not None:  # the validation curve ([step, KL]): the cycle's own held-back prompts
            point["val_kl"] = [m["step"], m["val_kl"]]
        store.append_cycle_point(cycle_id, point)
        if progress is not None:
            progress(m)

    with making_room(backend):  # the acting model's weights are the student's base: one copy in memory
        return run_job(job, on_step=on_step, shared_weights=getattr(backend, "model", None))


def cycle_metrics(
    config: RunConfig,
    cycle: Cycle,
    *,
    prompts: int,
    heldout: int,
    choice_mode: bool,
    train_seconds: float,
) -> dict[str, Any]:
    """The cycle row's metrics once it has trained (EVALUATE and the decision add theirs)."""
    (before, after), (lesson_before, lesson_after) = cycle.kl, cycle.lesson_kl
    system = cycle.system
    return {
        "heldout_kl": {"before": before, "after": after},
        "prompts": prompts,
        "heldout_prompts": heldout,
        "processes": config.opcd.trainer.processes,
        "objective": "choice" if choice_mode else "tokens",
        "kind": cycle.kind,
        "teacher": cycle.teacher,
        "conditions": _conditions(config, cycle.parent, cycle.teacher, system),
        **({"context_sha256": system.sha256} if system else {}),
        "train_seconds": train_seconds,
        "lesson_kl": {str(i): {"before": lesson_before[i], "after": lesson_after[i]} for i in lesson_before},
    }


def _decide(run: Run, cycle: Cycle, evals: dict[str, list[EvalResult]]) -> CycleReport:
    """EVALUATE's rows (their rates are `cycle.metrics["evaluation"]`), then PROMOTE or ROLLBACK (the caller holds
    the transaction, so what a person changed while the cycle trained is seen here: a parent rolled back or a lesson
    forgotten meanwhile is a rollback): recording, the decision (`promotion.decide_cycle`), applying it."""
    _record_evaluations(run, cycle, evals)
    by_env, games = rates_and_games(evals)
    cycle.metrics["evaluation_by_env"] = by_env
    decision = decide_cycle(
        cycle.metrics["evaluation"],
        cycle.kl,
        cycle.lesson_kl,
        run.config.opcd,
        by_env=by_env,
        changed=changed_meanwhile(run.store, run.id, cycle.live, cycle.parent),
        games=games,
    )
    return _apply(run, cycle, decision)


def _record_evaluations(run: Run, cycle: Cycle, evals: dict[str, list[EvalResult]]) -> None:
    """One evaluation row per condition and environment, with its episodes (validation games on their fold)."""
    live = cycle.live
    for condition, results in evals.items():
        for r in results:
            lo, hi = r.interval
            run.store.add_evaluation(
                r.env_id,
                run_id=run.id,
                adapter_id=cycle.adapter_id,
                cycle_id=cycle.cycle_id,
                lesson_set_version=live.version if live else None,
                split=run.config.opcd.validation_split if condition.startswith("validation_") else "eval",
                policy=run.config.model.name,
                num_episodes=r.n,
                success_rate=r.success_rate,
                mean_return=r.mean_return,
                metrics={"condition": condition, "episodes": r.episodes, "ci95": [lo, hi]},
            )


def _apply(run: Run, cycle: Cycle, decision: CycleDecision) -> CycleReport:
    """Write the decision: the cycle rolled back, or promoted with its internalised lessons out of the live set."""
    store, cycle_id, metrics = run.store, cycle.cycle_id, cycle.metrics
    metrics["decision"] = "promoted" if decision.promoted else "rolled_back"
    metrics["reasons"] = decision.reasons
    store.update_cycle(cycle_id, metrics=metrics)
    if not decision.promoted:
        store.rollback_cycle(cycle_id, error="; ".join(decision.reasons))
        return CycleReport(cycle_id, "rolled_back", decision.reasons, cycle.adapter_id, metrics=metrics)
    consolidated = decision.consolidated
    store.promote_cycle(cycle_id, consolidated)
    if consolidated:  # from the live set as it is now (a person may have added or retired lessons meanwhile)
        now = live_version(store, run.id)
        remaining = [i for i in (now.lesson_ids if now else []) if i not in set(consolidated)]
        create_version(store, run.id, remaining, note=f"cycle {cycle_id} consolidated {len(consolidated)} lessons")
    # the line shows the KL and rates already; it says the validation drops let through as too few games
    return CycleReport(cycle_id, "promoted", decision.reasons[1:], cycle.adapter_id, consolidated, metrics)


def roll_back_interrupted(store: ExperienceStore, run_id: int, why: str) -> None:
    """Roll back the run's cycles still marked running: whatever ran them stopped before the end."""
    for stale in store.cycles(run_id, status="running"):
        store.rollback_cycle(stale.id, error=f"interrupted: {why}")


def _text(lessons, lesson_id: int) -> str:
    return next(x.text for x in lessons if x.id == lesson_id)


def _lesson_prompts(lesson, decisions: list[Decision], fallback: list[Decision], limit: int = 4) -> list[Decision]:
    """Prompts from the lesson's own source episodes (its 'source tasks'), else the held-out prompts."""
    sources = set(lesson.source_episode_ids)
    own = [d for d in decisions if sources & set(d.episode_ids)]
    return (own or fallback)[:limit]
