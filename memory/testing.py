"""Test doubles for the experience memory, shipped with it: episode records built in code, and a demo store.

What:
- `make_steps(n, task_id=)` and `make_episode(n_steps, ...)`: a small episode whose every field holds a
  non-default value (steps alternate parsed and unparsed actions, infos are nested), deterministic to the
  microsecond -- what a round trip through the store is checked with.
- `game_steps(env_id, task_id, n, won=, seed=)` and `game_episode(env_id, task_id, won=, ...)`: a plausible
  game (a frozen-lake grid or a TextWorld room per turn, a winning last move), optionally played in choice
  mode (a log-probability per admissible action), ending now unless told when.
- `seed_demo_store(target, episodes=120) -> ids`: one run over two environments (`DEMO_ENVS`) written
  through the `ExperienceStore` API: episodes whose success rises as lessons arrive, lesson extractions,
  lesson-set versions across two pools, two OPCD cycles (one promoted, one rolled back) with loss and KL
  curves and the evaluations `agent_runtime.phases.consolidate` stores (teacher and student, with and without
  lessons, per environment, plus retention, each with its 95% interval), validation-gate decisions,
  measured lesson utilities, an adapter lineage, episodes after the first promotion played in choice mode,
  and hashed embeddings (`DEMO_EMBEDDER`) so search works.

Why it ships in the package (like pydantic-ai's `TestModel`): the memory's own tests, distill's, the
dashboard's, the screenshot script (`bench/screenshots.py`) and anyone trying the dashboard without a real
run need the same records and the same believable store, and tests must not import one another. Nothing
calls it at runtime. Everything is deterministic (seeded) except the game episodes' timestamps, which are
real so that the demo's OPCD cycles fall between the episodes they followed, as in a real run.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import random
from collections.abc import Sequence
from typing import Any

from memory.embeddings import HashEmbedder
from memory.intervals import wilson_interval
from memory.models import EVALUATION_GATE, EVALUATION_LESSON_UTILITY
from memory.records import EpisodeRecord, StepRecord
from memory.store import ExperienceStore

DEMO_ENVS = ("textarena/frozenlake", "textworld/coin_collector")
RETENTION_ENV = "math/arithmetic"
DEMO_EMBEDDER = HashEmbedder(dim=64)
DEMO_POLICY = "smollm2-135m-instruct"
LESSON_TEXTS = (
    "Before stepping, check whether the next tile is a hole; holes are only visible one step ahead.",
    "When an exit is blocked, go back to the last room with an unexplored door instead of repeating the move.",
    "Prefer the admissible action that names an object from the goal over movement commands.",
    "If the frozen lake map shows the goal in the bottom-right, move down before moving right.",
    "Read the room description for the coin before leaving the room; 'take coin' ends the game.",
    "Invalid actions waste a turn: copy one of the admissible actions verbatim.",
    "Keep a mental map of visited rooms and never revisit one that had no exits left.",
    "When two moves look equally good, choose the one that keeps you away from the lake's edge.",
)
GAME_ACTIONS = ("go north", "go east", "take coin", "move down", "move right")


# -- records -----------------------------------------------------------------------------------


def make_steps(n: int = 3, *, task_id: str = "task-0") -> list[StepRecord]:
    """`n` fully populated turns: even ones parsed ("go north"), odd ones not (action None)."""
    return [
        StepRecord(
            index=i,
            observation=f"You are in room {i} of {task_id}. Exits: north, south.",
            prompt=f"<system>play</system>\n<obs>room {i}</obs>",
            response=f"I go north ({i})",
            action="go north" if i % 2 == 0 else None,
            valid_action=i % 2 == 0,
            reward=0.5 * i,
            admissible_actions=["go north", "go south"] if i % 2 == 0 else None,
            prompt_tokens=100 + i,
            completion_tokens=10 + i,
            latency_s=0.25 * i,
            info={"score": i, "nested": {"k": [1, 2.5, "x"]}},
        )
        for i in range(n)
    ]


def make_episode(
    n_steps: int = 3,
    *,
    env_id: str = "toy/corridor",
    task_id: str = "task-0",
    outcome: str = "won",
    goal: str | None = "reach the end of the corridor",
    lessons: list[int] | None = None,
    seed: int | None = 7,
) -> EpisodeRecord:
    """A small but fully populated episode record (every field non-default), started 2026-01-02."""
    start = dt.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=dt.UTC)
    return _episode(
        make_steps(n_steps, task_id=task_id),
        env_id=env_id,
        task_id=task_id,
        seed=seed,
        outcome=outcome,
        started_at=start,
        ended_at=start + dt.timedelta(seconds=12.5),
        error="boom" if outcome == "error" else None,
        goal=goal,
        lessons_in_context=lessons or [],
        metadata={"temperature": 0.7, "tags": ["a", "b"]},
    )


def _episode(steps: list[StepRecord], *, outcome: str, **fields: Any) -> EpisodeRecord:
    """An episode record around `steps`, with the totals that follow from them."""
    fields.setdefault("policy", DEMO_POLICY)
    fields.setdefault("adapter_id", None)
    fields.setdefault("lesson_set_version", None)
    return EpisodeRecord(
        outcome=outcome,
        won=outcome == "won",
        total_return=sum(s.reward for s in steps),
        prompt_tokens=sum(s.prompt_tokens for s in steps),
        completion_tokens=sum(s.completion_tokens for s in steps),
        steps=steps,
        **fields,
    )


def _observation(env_id: str, task: str, index: int, rng: random.Random) -> str:
    if env_id.startswith("textarena"):
        grid = ["".join(rng.choice("FFFH") for _ in range(3)) for _ in range(3)]
        return f"Turn {index + 1}. You are on the frozen lake ({task}).\n" + "\n".join(grid)
    rooms = ("kitchen", "pantry", "cellar", "attic", "garden")
    room = rooms[(index + len(task)) % len(rooms)]
    return f"-= {room.title()} =-\nYou are in the {room}. Exits lead north and east. ({task})"


def game_steps(
    env_id: str,
    task_id: str,
    n: int,
    *,
    won: bool,
    seed: int = 0,
    observation: str | None = None,
    choice: bool = False,
) -> list[StepRecord]:
    """`n` plausible turns (a winning "take coin" last if `won`); `observation` replaces the first turn's;
    `choice`: each turn's info holds a log-probability per admissible action, as choice mode stores it."""
    rng = random.Random(seed)
    actions = list(GAME_ACTIONS)
    steps = []
    for i in range(n):
        last = i == n - 1
        action = rng.choice(actions) if not last or not won else "take coin"
        info: dict[str, Any] = {"turn": i + 1}
        if choice:
            weights = [rng.random() + (3.0 if a == action else 0.0) for a in actions]
            info.update(action_mode="choice", choice_logprobs=[round(math.log(w / sum(weights)), 4) for w in weights])
        steps.append(
            StepRecord(
                index=i,
                observation=observation
                if (observation is not None and i == 0)
                else _observation(env_id, task_id, i, rng),
                prompt=f"<|system|>You play {env_id}.\n<|user|>turn {i + 1}: what do you do?",
                response=f"I think the best move is to {action}.\nACTION: {action}",
                action=action if choice or rng.random() > 0.1 else None,
                valid_action=True,
                reward=1.0 if (last and won) else 0.0,
                admissible_actions=actions,
                prompt_tokens=180 + 40 * i,
                completion_tokens=24,
                latency_s=0.4,
                info=info,
            )
        )
    steps[-1].valid_action = steps[-1].action is not None
    return steps


def game_episode(
    env_id: str,
    task_id: str,
    *,
    won: bool,
    n_steps: int = 4,
    ended_at: dt.datetime | None = None,
    seed: int = 0,
    adapter_id: int | None = None,
    lesson_set_version: int | None = None,
    lessons_in_context: Sequence[int] = (),
    observation: str | None = None,
    choice: bool = False,
) -> EpisodeRecord:
    """A plausible finished game (see `game_steps`); a lost one is "truncated" when `seed` is a multiple of 5."""
    ended_at = ended_at or dt.datetime.now(dt.UTC)
    steps = game_steps(env_id, task_id, n_steps, won=won, seed=seed, observation=observation, choice=choice)
    return _episode(
        steps,
        env_id=env_id,
        task_id=task_id,
        seed=seed,
        adapter_id=adapter_id,
        lesson_set_version=lesson_set_version,
        outcome="won" if won else ("truncated" if seed % 5 == 0 else "lost"),
        started_at=ended_at - dt.timedelta(seconds=1 + n_steps),
        ended_at=ended_at,
        goal="collect the coin" if env_id.startswith("textworld") else "reach the goal without falling",
        lessons_in_context=list(lessons_in_context),
        metadata={"draw": seed},
    )


# -- the demo store ----------------------------------------------------------------------------


def _curve(rng: random.Random, start: float, end: float, n: int = 60) -> list[float]:
    return [start + (end - start) * (i / (n - 1)) ** 0.5 + rng.gauss(0, 0.02 * start) for i in range(n)]


def seed_demo_store(target: str | os.PathLike[str], *, episodes: int = 120) -> dict[str, int]:
    """Fill a new store at `target` with the demo run; returns the ids tests refer to."""
    rng = random.Random(7)
    with ExperienceStore.open(target, embedder=DEMO_EMBEDDER) as store:
        run_id = store.create_run("demo", {"name": "demo", "envs": list(DEMO_ENVS), "lessons": {"enabled": True}})
        context: list[int] = []
        version: int | None = None
        adapter_id: int | None = None
        ids: dict[str, int] = {"run": run_id}
        lesson_iter = iter(LESSON_TEXTS)
        for n in range(episodes):
            env_id = DEMO_ENVS[n % 2]
            p_win = 0.25 + 0.35 * min(1.0, len(context) / 6) + (0.15 if adapter_id else 0.0)
            lessons_now = context if n % 3 else []  # every third episode plays without lessons
            record = game_episode(
                env_id,
                f"{env_id.split('/')[1]}-{n % 9}",
                won=rng.random() < p_win,
                n_steps=rng.randint(2, 6),
                seed=n,
                adapter_id=adapter_id,
                lesson_set_version=version if lessons_now else None,
                lessons_in_context=lessons_now,
                choice=adapter_id is not None,
            )
            episode_id = store.add_episode(run_id, record, run_state={"episodes": n + 1})
            ids.setdefault("first_episode", episode_id)
            if n % 20 == 19:  # EXTRACT every 20 episodes
                texts = [t for t in (next(lesson_iter, None), next(lesson_iter, None)) if t]
                if texts:
                    _, new = store.record_extraction(
                        DEMO_POLICY,
                        texts,
                        run_id=run_id,
                        episode_ids=[episode_id - 1, episode_id],
                        prompt="Read this trajectory and write 1-2 general lessons.",
                        response="\n".join(f"- EXPERIENCE ITEM: {t}" for t in texts),
                        env_id=env_id,
                        pool=(n // 20) % 2,
                    )
                    store.set_lesson_status(new, "active")
                    ids.setdefault("source_episode", episode_id)
                    context += new
                    version = store.create_lesson_set(
                        run_id, context, token_count=25 * len(context), note=f"after episode {episode_id}"
                    ).version
                    current, candidate = 0.3 + 0.05 * version, 0.35 + 0.05 * version
                    store.add_evaluation(
                        env_id,
                        run_id=run_id,
                        lesson_set_version=version,
                        kind=EVALUATION_GATE,
                        split=EVALUATION_GATE,
                        policy="lesson-gate",
                        num_episodes=20,
                        success_rate=candidate,
                        metrics={
                            "promote": True,
                            "current_rate": current,
                            "candidate_rate": candidate,
                            "reason": "the candidate is not worse than the current set by more than the 5-point margin",
                        },
                    )
            if n in (59, 99):  # CONSOLIDATE
                cycle = store.start_cycle(
                    run_id,
                    {"lr": 2e-6, "tau": 0.7, "top_k": 256, "steps": 60},
                    lesson_set_version=version,
                    base_adapter_id=adapter_id,
                )
                ids.setdefault("cycle", cycle)
                new_adapter = store.add_adapter(
                    f"adapter-{cycle}",
                    f"runs/demo/adapters/{cycle}",
                    run_id=run_id,
                    parent_id=adapter_id,
                    base_model=DEMO_POLICY,
                )
                promoted = n == 59
                store.update_cycle(
                    cycle,
                    adapter_id=new_adapter,
                    status="succeeded",
                    ended=True,
                    curves={"loss": _curve(rng, 1.2, 0.35), "kl": _curve(rng, 0.8, 0.12 if promoted else 0.5)},
                    metrics={
                        "final_loss": 0.35,
                        "reasons": ["student without lessons reached 92% of the teacher with lessons"]
                        if promoted
                        else ["retention fell 9 points (limit 5)"],
                        "heldout_kl": {"before": 0.81, "after": 0.12 if promoted else 0.5},
                    },
                )
                _add_cycle_evaluations(store, run_id, cycle, new_adapter, version, promoted)
                if promoted:
                    store.promote_cycle(cycle, context[:2])
                    adapter_id = new_adapter
                    store.set_lesson_status(context[:1], "retired")  # the student no longer needs it
                    context = context[1:]
                    version = store.create_lesson_set(
                        run_id,
                        context,
                        token_count=25 * len(context),
                        note=f"retired a lesson consolidated by cycle {cycle}",
                    ).version
                else:
                    store.rollback_cycle(cycle)
        store.update_run(run_id, phase="PLAY", status="running")
        utilities = {}
        for lesson in store.lessons(run_id):
            n_with = lesson.times_in_context
            rate_with = lesson.wins_in_context / n_with if n_with else None
            utilities[str(lesson.id)] = {
                "utility": None if rate_with is None else rate_with - 0.4,
                "rate_with": rate_with,
                "rate_without": 0.4,
                "n_with": n_with,
                "n_without": 40,
            }
        store.add_evaluation(
            "*",
            run_id=run_id,
            kind=EVALUATION_LESSON_UTILITY,
            split=EVALUATION_LESSON_UTILITY,
            policy="logged-episodes",
            metrics={"utilities": utilities},
        )
        store.reindex()
        ids["last_episode"] = episode_id
        return ids


def _add_cycle_evaluations(
    store: ExperienceStore, run_id: int, cycle: int, adapter: int, version: int | None, promoted: bool
) -> None:
    """The rows `agent_runtime.phases.consolidate` writes for a cycle: one per condition and environment."""
    rates = {
        "teacher_with_lessons": 0.6,
        "teacher_without_lessons": 0.35 if promoted else 0.45,
        "student_with_lessons": 0.65,
        "student_without_lessons": 0.55 if promoted else 0.4,
    }
    rows = [(c, env, rate + (0.05 if i else -0.05)) for c, rate in rates.items() for i, env in enumerate(DEMO_ENVS)]
    rows += [("teacher_retention", RETENTION_ENV, 0.5), ("student_retention", RETENTION_ENV, 0.5 if promoted else 0.4)]
    for condition, env_id, rate in rows:
        n = 20
        successes = round(rate * n)
        low, high = wilson_interval(successes, n)
        store.add_evaluation(
            env_id,
            run_id=run_id,
            cycle_id=cycle,
            adapter_id=adapter,
            lesson_set_version=version,
            split="eval",
            policy=DEMO_POLICY,
            num_episodes=n,
            success_rate=successes / n,
            mean_return=successes / n,
            metrics={"condition": condition, "ci95": [low, high]},
        )
