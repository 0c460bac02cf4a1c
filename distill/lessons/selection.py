"""Which induced lessons go live: the lessons induced from a run's won and lost episodes (`induce`) are tried on
the gate's games, paired against the live lessons, and those that raise success go live as one new version;
every induced lesson is stored with its evidence and its trial, kept out or not.

What: `induce_and_select(store, run_id, curator, evidence, settings, outcomes, confirm=None) -> (trials, new version
or None)`. `outcomes(lessons, envs=None)` is how the caller plays the trials' games (`lessons.trial_split`) with a set
of lessons (each a `ScopedLesson`) in context, on every environment or on `envs` only, and returns who won each game
({(env id, task id, seed): won}, what `decide_gate` pairs): the runtime plays them (`GameTrials`), a test can
script them. The search: per environment the findings came from, on that environment's games only; within one,
the whole set first, then backward elimination or forward selection (`_try_lessons` says why).

`confirm` plays the gate's games (`lessons.gate_split`, the validation fold) the same way: the set the search chose
goes live only if, there, it does not lower success against the live lessons by more than `gate_margin`. The search
picks among candidates on the games it was fitted on; the go-live decision is made on games that took no part in
it, so a lesson that won its trial by chance is caught before it enters the context. Without `confirm` the search's
own games decide.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from tqdm.auto import tqdm

from distill.lessons.config import LessonsConfig
from distill.lessons.curate import LessonCurator
from distill.lessons.extractor import Proposal
from distill.lessons.gate import decide_gate, store_gate_decision
from distill.lessons.induce import induce
from distill.lessons.scope import ScopedLesson, scoped_lessons
from distill.lessons.versions import live_lessons
from memory import EpisodeInfo, ExperienceStore

Outcomes = Callable[..., dict]


def induce_and_select(
    store: ExperienceStore,
    run_id: int,
    curator: LessonCurator,
    evidence: list[EpisodeInfo],
    settings: LessonsConfig,
    outcomes: Outcomes,
    confirm: Outcomes | None = None,
) -> tuple[list[dict], int | None]:
    """Induce lessons from `evidence` (episodes with their steps), try them with `outcomes` on top of the live
    lessons, and put those that earn their place live. Returns (one dict per induced lesson: its text,
    evidence, trial and whether it was accepted, and its stored lesson id; the new live version or None)."""
    live, current = live_lessons(store, run_id, pool=0)
    findings = induce(
        evidence,
        min_support=settings.induce_min_support,
        min_gap=settings.induce_min_gap,
        max_candidates=settings.induce_candidates,
        max_chars=settings.max_item_chars,
        known=[x.text for x in current],
    )  # what a live lesson already says is no candidate
    if not findings:
        return [], None

    texts = scoped_lessons(current)
    with tqdm(
        total=len(findings) + 2 * len({f.env_id for f in findings}),
        desc="EXTRACT: trying induced lessons",
        unit="set",
        file=sys.stderr,
        disable=None,
    ) as bar:
        trials, start, final, joint = _try_per_env(findings, texts, outcomes, settings, bar)
    accepted = [t["text"] for t in trials if t["accepted"]]
    specs, tags = [], []  # one row per trial (pool 0), and one per further pool for the accepted ones
    for index, t in enumerate(trials):
        for pool in range(curator.pools if t["accepted"] else 1):
            specs.append(
                {
                    "text": t["text"],
                    "pool": pool,
                    "env_id": t["evidence"]["env_id"],
                    "token_count": curator.count_tokens(t["text"]),
                    "source_episode_ids": sorted(
                        {*t["evidence"]["won_episode_ids"], *t["evidence"]["lost_episode_ids"]}
                    ),
                    "metadata": {"evidence": t["evidence"], "trial": t["trial"], "accepted": t["accepted"]},
                }
            )
            tags.append(index)
    extraction_id, lesson_ids = store.record_extraction(
        "induce",
        specs,
        run_id=run_id,
        episode_ids=[e.id for e in evidence],
        env_id=None,
        metadata={
            "style": "evidence",
            "empty": False,
            "items": [t["text"] for t in trials],
            "rejected": [],
            "accepted": accepted,
            "trials": trials,
            "joint_trial": joint,
        },
    )
    for t, lesson_id in zip(trials, (lesson_ids[tags.index(i)] for i in range(len(trials)))):
        t["lesson_id"] = lesson_id
    if not accepted:
        return trials, None
    curator.begin()
    curator.apply(
        [
            Proposal(
                op="add",
                text=spec["text"],
                pool=spec["pool"],
                extraction_id=extraction_id,
                source_episode_ids=tuple(spec["source_episode_ids"]),
                lesson_id=lesson_id,
            )
            for spec, index, lesson_id in zip(specs, tags, lesson_ids)
            if trials[index]["accepted"]
        ]
    )
    result = curator.commit(
        candidate=True,
        note=f"induced from {len(evidence)} episode(s); {len(accepted)} of {len(trials)} raised success on trial",
    )
    if result.version is None:
        return trials, None
    if confirm is not None:
        envs = sorted({t["evidence"]["env_id"] for t in trials if t["accepted"]})
        chosen = [*texts, *(ScopedLesson(t["text"], (t["evidence"]["env_id"],)) for t in trials if t["accepted"])]
        start, final = confirm(texts, envs=envs), confirm(chosen, envs=envs)
    decision = decide_gate(start, final, margin=settings.gate_margin)
    store_gate_decision(
        store,
        decision,
        run_id=run_id,
        env_id="*",
        current_version=live.version if live else None,
        candidate_version=result.version.version,
    )
    where = "on the gate's games" if confirm is not None else "on their trials' games"
    if not decision.promote:
        curator.reject(result.version.version, note=f"induced lessons kept out {where}: {decision.reason}")
        for t in trials:
            t["confirmed"] = False if t["accepted"] else None
        return trials, None
    for t in trials:
        t["confirmed"] = True if t["accepted"] else None
    curator.promote(result.version.version, note=f"induced lessons tried one by one, then {where}: {decision.reason}")
    return trials, result.version.version


def _scoped(finding) -> ScopedLesson:
    """An induced lesson as it is tried: in the prompts of the environment whose evidence produced it."""
    return ScopedLesson(finding.text, (finding.env_id,))


def _try_per_env(findings: list, texts: list[ScopedLesson], outcomes, settings, bar):
    """`_try_lessons` once per environment the findings came from, on that environment's games only: an induced
    lesson is in the prompts of its own environment alone, so each environment's lessons are searched together
    (they may work only together) and judged where they act (why: bench/RESULTS.md, "Continual learning", (a)).
    Returns the same four as `_try_lessons`, merged (the joint trials by environment when there are several)."""
    groups: dict[str, list] = {}
    for finding in findings:
        groups.setdefault(finding.env_id, []).append(finding)
    if len(groups) == 1:  # its games only: the other environments' are unchanged and would dilute the trial
        (env_id,) = groups
        return _try_lessons(findings, texts, lambda lessons: outcomes(lessons, envs=[env_id]), settings, bar)
    decided, start, final, joints = {}, {}, {}, {}
    for env_id, group in groups.items():
        trials, env_start, env_final, joint = _try_lessons(
            group, texts, lambda lessons, env_id=env_id: outcomes(lessons, envs=[env_id]), settings, bar
        )
        decided.update({t["text"]: t for t in trials})
        start.update(env_start)
        final.update(env_final)
        joints[env_id] = joint
    return [decided[f.text] for f in findings], start, final, joints


def _try_lessons(
    findings: list, texts: list[ScopedLesson], outcomes, settings, bar
) -> tuple[list[dict], dict, dict, dict | None]:
    """Which induced lessons earn their place, on the gate's games (paired, same tasks and seeds).

    Lessons can work only together (on coin-collector, lessons that each left the base model where it was raised
    its held-out success together: bench/RESULTS.md, "Lessons from its own experience"), so the whole set is
    tried first; if it raises success over the live lessons, each lesson (weakest evidence first) is
    dropped when the set without it does as well (backward elimination). If the whole set does not raise success,
    each lesson is tried alone on top of the live ones and those accepted before it (forward selection). A
    lesson's trial is the comparison that decided it: the set without it (current) against the set with it.
    Returns (one dict per finding, outcomes of the live lessons, outcomes of what goes live, the whole set's
    trial against the live lessons or None when there was one finding)."""

    def verdict(finding, without: dict, with_it: dict, accepted: bool) -> dict:
        decision = decide_gate(without, with_it, margin=settings.gate_margin)
        return {
            "text": finding.text,
            "evidence": finding.evidence(),
            "accepted": accepted,
            "trial": {k: v for k, v in decision.to_dict().items() if k != "keys"},
        }

    def raises(current: dict, candidate: dict) -> bool:
        return decide_gate(current, candidate, margin=settings.gate_margin).delta > settings.induce_min_gain

    start = outcomes(texts)
    bar.update()
    together = outcomes([*texts, *map(_scoped, findings)]) if len(findings) > 1 else None
    bar.update()
    joint = (
        None
        if together is None
        else {
            k: v for k, v in decide_gate(start, together, margin=settings.gate_margin).to_dict().items() if k != "keys"
        }
    )
    decided: dict[str, dict] = {}
    if together is not None and raises(start, together):
        kept, best = list(findings), together
        for finding in reversed(findings):  # the weakest evidence first
            rest = [f for f in kept if f is not finding]
            without = outcomes([*texts, *map(_scoped, rest)]) if rest else start
            needed = raises(without, best)
            decided[finding.text] = verdict(finding, without, best, needed)
            if not needed:
                kept, best = rest, without
            bar.update()
        return [decided[f.text] for f in findings], start, best, joint
    reference, accepted = start, []
    for finding in findings:
        trial = outcomes([*texts, *accepted, _scoped(finding)])
        raised = raises(reference, trial)
        decided[finding.text] = verdict(finding, reference, trial, raised)
        if raised:
            accepted.append(_scoped(finding))
            reference = trial
        bar.update()
    return [decided[f.text] for f in findings], start, reference, joint
