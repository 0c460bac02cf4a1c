"""Where a candidate lesson set's new lessons go live: the gate's rules per environment, alone and together.

A lesson is evidence about the environment it came from (`distill.lessons.scope`), so a candidate is judged where
it would act: in each environment whose prompt it changes, on that environment's gate games (`lessons.gate_episodes`
of `lessons.gate_split`, fixed seeds), paired against the live set (`decide_gate`). What it decides, per new lesson:
- proposed for named environments (an induced or extracted lesson: its own; a person's with `lessons add --env`):
  live in each where the gate's rule lets it (success not lower by more than `lessons.gate_margin`);
- proposed for every environment (a person's lesson without `--env`), in a run of several: live only where its
  trial raised success, never where it lowered it or changed nothing (`lets_in`). In a run of one environment the
  gate's own rule decides, as before scopes. Several such lessons arriving together (a `lessons.seed` list, two
  `lessons add` before the gate) are each also tried alone on top of the live set (`decide_alone`), and each goes
  live where its own trial raised success: the set's trial cannot say which of them did. Where that lets several
  into one environment, they are played there together too, and stay together only if the combination also raises
  success and does at least as well as the best of them alone; otherwise only that best one goes live there
  (`decide_together`).
A lesson is narrowed to the environments that let it in (its scope rewritten, with each environment's decision in
its metadata, `scope_trials`); one that none let in leaves the candidate. Each environment's decision is stored as a
gate row of its own (`store_gate_decision`, `env_id` set), saying what happened there (`happened`).

What: `decide_candidate(current, candidate, members, envs, outcomes, margin=)` takes the decisions without touching
the store; `gate_candidate(store, run_id, curator, version, envs, outcomes, margin=)` reads the candidate, asks
`decide_candidate` and applies its answer (gate rows, narrowed scopes, promote, reject or a version of what got in).
`outcomes(lessons, envs=)` is how the caller plays the gate's games with a set of lessons (each a `ScopedLesson`) on
the environments `envs` and returns who won each game ({(env id, task id, seed): won}): the runtime plays them
(`agent_runtime.phases.lesson_trials.GameTrials`), a test can script them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from distill.lessons.curate import LessonCurator
from distill.lessons.gate import GateDecision, decide_gate, store_gate_decision
from distill.lessons.scope import ScopedLesson, for_env, in_scope, is_global, scoped_lessons
from distill.lessons.versions import create_version, live_lessons
from memory import ExperienceStore

Outcomes = Callable[..., dict]
Envs = Mapping[str, "str | None"]  # the run's environments in its order: env id -> its prompt family


@dataclass
class GateOutcome:
    reason: str
    decisions: dict[str, GateDecision] = field(default_factory=dict)  # per environment the candidate changes
    narrowed: dict[int, list[str]] = field(default_factory=dict)  # lesson id -> the environments it went live in
    dropped: list[int] = field(default_factory=list)  # lessons no environment let in
    new: list[int] = field(default_factory=list)  # the candidate's lessons that are not live yet
    scope_trials: dict[int, dict] = field(default_factory=dict)  # narrowed lesson id -> its decisions, as stored


def changed_envs(before: list[ScopedLesson], after: list[ScopedLesson], envs: Envs) -> list[str]:
    """The environments whose prompt `after` changes: their in-scope lessons differ from `before`'s."""
    return [e for e, family in envs.items() if for_env(before, e, family) != for_env(after, e, family)]


def decide_in(env_id: str, start: dict, trial: dict, margin: float) -> GateDecision:
    """The gate's decision in one environment: its games of `start` and `trial` paired."""
    return decide_gate(
        {k: v for k, v in start.items() if k[0] == env_id},
        {k: v for k, v in trial.items() if k[0] == env_id},
        margin=margin,
    )


def lets_in(decision: GateDecision, everywhere: bool) -> bool:
    """An environment lets a lesson in when the gate promotes there and, for a lesson proposed everywhere, its trial
    raised success."""
    return decision.promote and (decision.delta > 0 or not everywhere)


def decide_alone(
    outcomes: Outcomes, start: dict, current: list, new: list, changed: list[str], n_envs: int, margin: float
) -> dict[str, dict[str, GateDecision]]:
    """{text: {env id: decision}} for each new lesson proposed for every environment, tried alone on top of the live
    set, when several such lessons arrive together (`lessons add` twice before the gate, a `lessons.seed` list): the
    set's trial cannot say which of them raised success where, and each goes live only where its own trial did."""
    everywhere = [x for x in new if is_global(x.scope)] if n_envs > 1 else []
    if len(everywhere) < 2:
        return {}
    out: dict[str, dict[str, GateDecision]] = {}
    for lesson in everywhere:
        trial = outcomes(scoped_lessons([*current, lesson]), envs=changed)
        out[lesson.text] = {env_id: decide_in(env_id, start, trial, margin) for env_id in changed}
    return out


def decide_together(
    outcomes: Outcomes, start: dict, current: list, tried_alone: list, alone: dict, placed: dict, margin: float
) -> dict[int, dict[str, tuple[GateDecision, list[int]]]]:
    """Where the lessons' own trials let several of them into one environment, the combination is played there too
    (the lessons that each raise success alone can lower it together: contradictory advice). The combination stays
    when it raises success over the live set and does at least as well as the best of them alone; otherwise only
    the best one alone goes live there (the largest own gain; the first proposed on a tie), and the others are kept
    out of that environment. Returns, per lesson of a combination, {env id: (the combination's decision, the other
    lessons' ids)}, and narrows `placed` (lesson id -> the environments it goes live in) in place."""
    out: dict[int, dict[str, tuple[GateDecision, list[int]]]] = {}
    for env_id in dict.fromkeys(e for x in tried_alone for e in placed[x.id]):
        let_in = [x for x in tried_alone if env_id in placed[x.id] and env_id in alone[x.text]]
        if len(let_in) < 2:
            continue
        combined = outcomes(scoped_lessons([*current, *let_in]), envs=[env_id])
        decision = decide_in(env_id, start, combined, margin)
        best = max(let_in, key=lambda x: alone[x.text][env_id].candidate_rate)
        if not (lets_in(decision, True) and decision.candidate_rate >= alone[best.text][env_id].candidate_rate):
            for lesson in let_in:
                if lesson is not best:
                    placed[lesson.id].remove(env_id)
        for lesson in let_in:
            out.setdefault(lesson.id, {})[env_id] = (decision, [x.id for x in let_in if x is not lesson])
    return out


def happened(env_id: str, decision: GateDecision, new: list, proposed: dict, placed: dict, own: dict) -> GateDecision:
    """The set's decision in one environment, saying what happened there: the gate's own verdict when every new
    lesson proposed there went live; otherwise that they were kept out and why (a person's lesson proposed for every
    environment must raise success to enter one, so "promoted" by the gate's margin may still keep it out)."""
    entering = [x.id for x in new if env_id in proposed[x.id]]
    out = [i for i in entering if env_id not in placed[i]]
    if not out:
        return decision
    why = own[out[0]].get(env_id, decision)
    if not why.promote:
        cause = f"success fell by more than the margin {why.margin:.3f} ({why.summary})"
    elif why.delta <= 0:
        cause = f"it did not raise success ({why.summary})"
    else:
        cause = f"it raised success alone ({why.summary}), but not together with the others let in here"
    who = "" if len(out) == len(entering) else f"lessons {out} "
    return replace(decision, promote=len(out) < len(entering), reason=f"{who}kept out: {cause}")


def stored(decision: GateDecision) -> dict:
    """A decision as a lesson's metadata keeps it: without the games' keys, with their number."""
    return decision.to_dict() | {"keys": len(decision.keys)}


def decide_candidate(
    current: list, candidate: list, members: list, envs: Envs, outcomes: Outcomes, *, margin: float
) -> GateOutcome:
    """Which of the candidate's new lessons go live in which environments (see the module docstring), without
    touching the store. `current`: the live lessons of pool 0; `candidate`: the candidate's of pool 0; `members`:
    the candidate's of every pool (stored lessons: `id`, `text`, `scope`, `metadata`). No decisions (an empty
    `decisions`) when the candidate changes no environment's lessons."""
    before, after = scoped_lessons(current), scoped_lessons(candidate)
    changed = changed_envs(before, after, envs)
    outcome = GateOutcome("")
    if not changed:  # the candidate shows no environment anything new (e.g. it only drops lessons)
        return outcome
    start, trial = outcomes(before, envs=changed), outcomes(after, envs=changed)
    decisions = {env_id: decide_in(env_id, start, trial, margin) for env_id in changed}
    known = {x.id for x in current}
    new = [x for x in members if x.id not in known]
    alone = decide_alone(
        outcomes, start, current, [x for x in candidate if x.id not in known], changed, len(envs), margin
    )
    own: dict[int, dict[str, GateDecision]] = {}  # lesson id -> the decisions that placed it (its own, or the set's)
    placed: dict[int, list[str]] = {}  # lesson id -> the environments it goes live in
    proposed: dict[int, list[str]] = {}
    for lesson in new:
        proposed[lesson.id] = [e for e, family in envs.items() if in_scope(lesson.scope, e, family)]
        everywhere = is_global(lesson.scope) and len(envs) > 1
        own[lesson.id] = alone.get(lesson.text, decisions)
        placed[lesson.id] = [
            e for e in proposed[lesson.id] if e not in own[lesson.id] or lets_in(own[lesson.id][e], everywhere)
        ]
    together = decide_together(outcomes, start, current, [x for x in new if x.text in alone], alone, placed, margin)
    outcome.new = [x.id for x in new]
    for lesson in new:
        kept = placed[lesson.id]
        if not kept:
            outcome.dropped.append(lesson.id)
        elif kept != proposed[lesson.id] or (is_global(lesson.scope) and len(envs) > 1):
            outcome.narrowed[lesson.id] = kept
    outcome.decisions = {e: happened(e, d, new, proposed, placed, own) for e, d in decisions.items()}
    for lesson_id in outcome.narrowed:
        trials_meta = {e: stored(d) for e, d in own[lesson_id].items()}
        for env_id, (decision, others) in together.get(lesson_id, {}).items():
            trials_meta[env_id] = trials_meta[env_id] | {"together": stored(decision) | {"with": others}}
        outcome.scope_trials[lesson_id] = trials_meta
    return outcome


def gate_candidate(
    store: ExperienceStore,
    run_id: int,
    curator: LessonCurator,
    candidate_version: int,
    envs: Envs,
    outcomes: Outcomes,
    *,
    margin: float,
) -> GateOutcome:
    """Gate candidate `candidate_version` against the live set in every environment of `envs` it changes (its games
    played by `outcomes`), then promote it (narrowed to where its lessons earned their place) or reject it; each
    environment's decision is stored as a gate row. See the module docstring."""
    live, current = live_lessons(store, run_id, pool=0)
    candidate_set = next(s for s in store.lesson_sets(run_id) if s.version == candidate_version)
    members = store.lessons(run_id, ids=candidate_set.lesson_ids)
    candidate = [x for x in members if x.pool == 0]
    outcome = decide_candidate(current, candidate, members, envs, outcomes, margin=margin)
    if not outcome.decisions:
        curator.promote(candidate_version, note="changes no environment's lessons")
        outcome.reason = "promoted: the candidate changes no environment's lessons"
        return outcome
    for env_id in outcome.decisions:  # each row says what happened there, not only the gate's margin rule
        store_gate_decision(
            store,
            outcome.decisions[env_id],
            run_id=run_id,
            env_id=env_id,
            current_version=live.version if live else None,
            candidate_version=candidate_version,
        )
    shown = "; ".join(f"{e}: {d.reason}" for e, d in outcome.decisions.items())
    if len(outcome.dropped) == len(outcome.new):
        curator.reject(candidate_version, note=shown)
        outcome.reason = f"kept out of every environment it would enter: {shown}"
        return outcome
    for lesson_id, kept in outcome.narrowed.items():
        store.set_lesson_scope([lesson_id], kept, outcome.scope_trials[lesson_id])
    if outcome.dropped:  # a live version of what the trials let in (the candidate is then no longer pending)
        kept_ids = [i for i in candidate_set.lesson_ids if i not in set(outcome.dropped)]
        create_version(store, run_id, kept_ids, note=f"promoted candidate v{candidate_version} in part: {shown}")
    else:
        curator.promote(candidate_version, note=shown)
    narrowed = f"; {len(outcome.narrowed)} narrowed to the environments that let them in" if outcome.narrowed else ""
    dropped = f"; {len(outcome.dropped)} let in nowhere" if outcome.dropped else ""
    outcome.reason = f"promoted{narrowed}{dropped}: {shown}"
    return outcome
