"""EVALUATE, a cycle's evidence: every condition on the held-out games (the report's), the parent and the student on
validation games (`opcd.validation_split`: the promotion's), and a second look where a validation drop is too close to
call.
`agent_runtime.phases.consolidate` runs it and decides on what it returns (`agent_runtime.phases.promotion`)."""

from __future__ import annotations

from agent_runtime.config import RunConfig
from agent_runtime.evaluation import EvalResult
from agent_runtime.llm.base import acting
from agent_runtime.phases.cycle import Cycle
from agent_runtime.phases.promotion import validation_drops
from agent_runtime.state import Run
from distill.lessons.scope import for_env


def evaluate_cycle(run: Run, backend, cycle: Cycle) -> dict[str, list[EvalResult]]:
    """EVALUATE: every condition on the held-out tasks with fixed seeds (the random-admissible baseline, the
    parent and the new adapter with and without the lessons, and both on the retention environments), and the
    parent and the adapter on `validation_games` games of the validation fold (the decision's evidence), with more of them
    where a drop there is too close to call (`_recheck`)."""
    config, opcd = run.config, run.config.opcd
    n = opcd.eval_episodes or config.evaluation.episodes_per_env
    shown = cycle.shown()
    evals: dict[str, list[EvalResult]] = {"random": run.evaluate(random_policy(config), lessons=[], episodes_per_env=n)}
    retention = list(opcd.retention_envs)
    student = run.store.get_adapter(cycle.adapter_id)  # the adapter row the cycle wrote
    with acting(backend, cycle.parent):
        evals["teacher_without_lessons"] = run.evaluate(backend, lessons=[], episodes_per_env=n)
        evals["teacher_with_lessons"] = _with_lessons(run, backend, n, shown, evals["teacher_without_lessons"])
        if retention:
            evals["teacher_retention"] = run.evaluate(backend, lessons=[], episodes_per_env=n, envs=retention)
        if opcd.validation_games:
            evals.update(_validate(run, backend, "parent", shown))
    with acting(backend, student):
        evals["student_without_lessons"] = run.evaluate(backend, lessons=[], episodes_per_env=n)
        evals["student_with_lessons"] = _with_lessons(run, backend, n, shown, evals["student_without_lessons"])
        if opcd.validation_games:
            evals.update(_validate(run, backend, "student", shown))
        if retention:
            evals["student_retention"] = run.evaluate(backend, lessons=[], episodes_per_env=n, envs=retention)
    if opcd.validation_games:
        _recheck(run, backend, cycle, student, evals, shown)
    return evals


def _with_lessons(
    run: Run,
    backend,
    n: int,
    shown: dict,
    without: list[EvalResult],
    split="eval",
    envs: list | None = None,
    first: int = 0,
) -> list[EvalResult]:
    """A "with lessons" condition: played in the environments some lesson is in scope for; in the others the prompt
    is the one without lessons and greedy play is deterministic, so their games are `without`'s (not played twice).
    `envs`: those of the run's environments only (default: all of them)."""
    if shown.get("context"):
        return run.evaluate(backend, episodes_per_env=n, split=split, envs=envs, first=first, **shown)
    entries = run.config.envs if envs is None else envs
    taught = [e for e in entries if for_env(shown["lessons"], e.id, run.families.get(e.id))]
    played = (
        {r.env_id: r for r in run.evaluate(backend, episodes_per_env=n, split=split, envs=taught, first=first, **shown)}
        if taught
        else {}
    )
    return [played.get(r.env_id, r) for r in without]


def _validate(
    run: Run, backend, who: str, shown: dict, only: set[str] | None = None, first: int = 0, games: int | None = None
) -> dict[str, list[EvalResult]]:
    """The decision's evidence for `who` (parent or student): `opcd.validation_games` validation games of every
    environment, without and with the lessons, and of the retention environments: the held-out games stay the
    report's. `only`: those environments (by id), `first` and `games` (default `opcd.validation_games`) the
    tasks."""
    opcd = run.config.opcd
    n, split = games or opcd.validation_games, opcd.validation_split
    own = [e for e in run.config.envs if only is None or e.id in only]
    retention = [e for e in opcd.retention_envs if only is None or e.id in only]
    out: dict[str, list[EvalResult]] = {}
    if own:
        without = run.evaluate(backend, lessons=[], episodes_per_env=n, split=split, envs=own, first=first)
        out[f"validation_{who}"] = without
        if shown.get("lessons") or shown.get("context"):
            out[f"validation_{who}_with_lessons"] = _with_lessons(
                run, backend, n, shown, without, split=split, envs=own, first=first
            )
    if retention:
        out[f"validation_{who}_retention"] = run.evaluate(
            backend, lessons=[], episodes_per_env=n, envs=retention, split=split, first=first
        )
    return out


def _recheck(run: Run, backend, cycle: Cycle, student, evals: dict[str, list[EvalResult]], shown: dict) -> None:
    """A second look where a validation drop is over the margin but of fewer than `opcd.regression_games` games:
    the parent and the student play `opcd.recheck_games` more validation games of those environments (the next tasks,
    every validation condition), added to the first ones, so that the decision is made on more evidence instead
    of letting the drop through (small drops let through cycle after cycle add up to a family forgotten:
    bench/RESULTS.md, "Continual learning"). The environments looked at again are the cycle's `rechecked` metric."""
    opcd = run.config.opcd
    if not opcd.recheck_games:
        return
    by_env, games = rates_and_games(evals)
    close = sorted({d.env for d in validation_drops(by_env, opcd, games) if not d.regression})
    if not close:
        return
    more: dict[str, list[EvalResult]] = {}
    for who, adapter in (("parent", cycle.parent), ("student", student)):
        with acting(backend, adapter):
            more.update(
                _validate(run, backend, who, shown, set(close), first=opcd.validation_games, games=opcd.recheck_games)
            )
    for condition, results in more.items():
        extra = {r.env_id: r for r in results}
        evals[condition] = [
            EvalResult(r.env_id, r.episodes + extra[r.env_id].episodes) if r.env_id in extra else r
            for r in evals[condition]
        ]
    cycle.metrics["rechecked"] = {env: opcd.validation_games + opcd.recheck_games for env in close}


def rates_and_games(
    evals: dict[str, list[EvalResult]],
) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, int]]]:
    """Each condition's success rate and number of games per environment."""
    rates = {k: {r.env_id: r.success_rate for r in v} for k, v in evals.items()}
    return rates, {k: {r.env_id: r.n for r in v} for k, v in evals.items()}


def random_policy(config: RunConfig):
    """The random-admissible baseline: a uniformly random action of each decision's set, seeded."""
    from agent_runtime.llm.scripted import ScriptedBackend

    return ScriptedBackend(seed=config.evaluation.seed)
