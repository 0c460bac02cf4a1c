"""`check_env`: the conformance checker that every built-in passes and plugin authors run.

Like Gymnasium's env_checker, it plays the environment through its public contract and collects
every violation it finds (instead of stopping at the first), so an author sees the whole list:
the three splits handed out and pairwise disjoint (an environment without a validation fold is named as such),
reset before step, types of everything returned, reproducibility (same seed and task give the same
observations, and the same actions replay the same way), no state kept across `reset` (after other
episodes, the instance replays its first episode exactly: the runtime keeps instances between episodes and
evaluation lends them between calls; each admissible first action of a train task is tried before a replay, so a
state that one action carries across `reset` is caught whichever action it is), admissible actions as strings no longer than `MAX_ACTION_CHARS`,
finite rewards, terminated/truncated semantics (never both; truncation exactly at spec.max_steps; no step
after the end), invalid actions answered by the game rather than by an exception, and an idempotent
close. `cli_check` adds an episode of random admissible actions and is what `agent-runtime envs
check ENV_ID` runs.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from itertools import combinations
from typing import Any

from environments.base import (
    MAX_ACTION_CHARS,
    SPLITS,
    EnvSpec,
    MissingSplitError,
    ResetNeededError,
    StepResult,
    TextEnv,
)

FAMILIES = ("text", "arena", "math")
MAX_CHECKED_STEPS = 500
REUSE_STEPS = 10  # steps of the episode a fresh instance plays and the reused instance replays
# first actions of a train task tried, each followed by a replay (a seeded sample when a game offers more): two resets
# each, and a reset can cost seconds (an ALFWorld game)
PROBED_FIRST_ACTIONS = 8
STATE_FIELDS = ("action", "observation", "reward", "terminated", "truncated", "info")
INVALID_ACTION = "xyzzy plugh frobnicate"


class EnvCheckError(AssertionError):
    """The environment violates the TextEnv contract; `failures` lists every violation found."""

    def __init__(self, env_id: str, failures: list[str]) -> None:
        self.failures = failures
        super().__init__(f"{env_id} fails {len(failures)} check(s):\n" + "\n".join(f"- {f}" for f in failures))


def _fallback_action(env: TextEnv) -> str:
    return {"arena": "[up]", "math": "\\boxed{0}"}.get(getattr(env.spec, "family", "text"), "look")


def _check_info(where: str, info: Any, fail: Callable[[str], None]) -> None:
    if not isinstance(info, dict):
        fail(f"{where}: info must be a dict, got {type(info).__name__}")
        return
    actions = info.get("admissible_actions")
    if actions is not None and (not isinstance(actions, list) or not all(isinstance(a, str) for a in actions)):
        fail(f"{where}: info['admissible_actions'] must be a list of str, got {actions!r:.120}")
    elif actions and max(len(a) for a in actions) > MAX_ACTION_CHARS:
        longest = max(actions, key=len)
        fail(
            f"{where}: info['admissible_actions'] holds an action of {len(longest):,} characters ({longest!r:.60}); "
            f"the runtime never offers one longer than MAX_ACTION_CHARS={MAX_ACTION_CHARS:,}"
        )
    if "won" in info and not isinstance(info["won"], bool):
        fail(f"{where}: info['won'] must be a bool, got {type(info['won']).__name__}")
    if "goal" in info and not isinstance(info["goal"], str):
        fail(f"{where}: info['goal'] must be a str, got {type(info['goal']).__name__}")


def _check_step(where: str, result: Any, fail: Callable[[str], None]) -> bool:
    """Type-check one step result; True when it is usable for further checks."""
    if not isinstance(result, StepResult):
        fail(f"{where}: step() must return a StepResult, got {type(result).__name__}")
        return False
    if not isinstance(result.observation, str):
        fail(f"{where}: observation must be a str, got {type(result.observation).__name__}")
    if isinstance(result.reward, bool) or not isinstance(result.reward, (int, float)):
        fail(f"{where}: reward must be a float, got {type(result.reward).__name__}")
    elif not math.isfinite(result.reward):
        fail(f"{where}: reward must be finite, got {result.reward}")
    for name in ("terminated", "truncated"):
        if not isinstance(getattr(result, name), bool):
            fail(f"{where}: {name} must be a bool, got {type(getattr(result, name)).__name__}")
    if result.terminated and result.truncated:
        fail(f"{where}: terminated and truncated are both True (truncated means cut short, not ended)")
    _check_info(where, result.info, fail)
    return True


def _pick_action(info: dict, rng: random.Random, env: TextEnv) -> str:
    actions = info.get("admissible_actions") if isinstance(info, dict) else None
    return rng.choice(actions) if actions else _fallback_action(env)


def _play(env: TextEnv, task_id: str, rng: random.Random, steps: int) -> list[tuple[str, str, float, bool]]:
    """Reset onto task_id and play up to `steps` random admissible actions; the (action, obs, reward, done) trace."""
    _, info = env.reset(task_id=task_id)
    trace = []
    for _ in range(steps):
        action = _pick_action(info, rng, env)
        result = env.step(action)
        info = result.info
        done = result.terminated or result.truncated
        trace.append((action, result.observation, result.reward, done))
        if done:
            break
    return trace


def _trace(env: TextEnv, task_id: str, seed: int, actions: list[str] | None, rng: random.Random) -> list[tuple]:
    """Reset onto (task_id, seed) and play `actions` (or up to REUSE_STEPS random admissible ones when None) until
    they run out or the episode ends. Each state is (action, observation, reward, terminated, truncated, info), the
    reset's first (action "reset", no reward or flags)."""
    observation, info = env.reset(seed=seed, task_id=task_id)
    states: list[tuple] = [("reset", observation, None, None, None, info)]
    for n in range(len(actions) if actions is not None else REUSE_STEPS):
        action = actions[n] if actions is not None else _pick_action(info, rng, env)
        result = env.step(action)
        states.append((action, *result))
        info = result.info
        if result.terminated or result.truncated:
            break
    return states


def _same(was: Any, now: Any) -> bool:
    both_nan = isinstance(was, float) and isinstance(now, float) and math.isnan(was) and math.isnan(now)
    return both_nan or was == now


def _check_reuse(
    env: TextEnv, task_id: str, seed: int, fresh: list[tuple], played: str, fail: Callable[[str], None]
) -> bool:
    """After playing `played` (what the instance just did, in words), the instance replays `fresh` (its first
    episode, on `task_id`) with the same actions; every state must equal the fresh one's (an episode that ends sooner
    differs in its flags). The first state that differs is reported, with the field and both values; True when one
    did."""
    again = _trace(env, task_id, seed, [state[0] for state in fresh[1:]], random.Random(seed))
    what = (
        f"a reused instance plays differently from a fresh one: after playing {played}, reset(task_id={task_id!r}, "
        f"seed={seed}) and the fresh instance's actions"
    )
    rule = "reset must return the environment to a state that depends only on (task_id, seed)"
    for n, (was, now) in enumerate(zip(fresh, again)):
        differ = next((i for i in range(1, len(STATE_FIELDS)) if not _same(was[i], now[i])), None)
        if differ is not None:
            where = "reset" if n == 0 else f"step {n} ({was[0]!r})"
            fail(
                f"{what} differ at {where}: {STATE_FIELDS[differ]} {now[differ]!r:.120} where the fresh instance "
                f"gave {was[differ]!r:.120}; {rule}"
            )
            return True
    return False


def _check_first_actions(
    env: TextEnv, task: str, fresh_task: str, seed: int, fresh: list[tuple], fail: Callable[[str], None]
) -> None:
    """Each admissible first action of `task` (at most PROBED_FIRST_ACTIONS), played after a reset and followed by
    the replay of `fresh`: state that one action carries across `reset` (a key taken in a train room) is found
    whichever action it is, where one random trace would find it only by chance; the report names the action."""
    _, info = env.reset(task_id=task)
    offered = info.get("admissible_actions") if isinstance(info, dict) else None
    actions = list(dict.fromkeys(a for a in offered or [] if isinstance(a, str)))
    if len(actions) > PROBED_FIRST_ACTIONS:
        actions = random.Random(seed).sample(actions, PROBED_FIRST_ACTIONS)
    for n, action in enumerate(actions):
        if n:
            env.reset(task_id=task)
        env.step(action)
        if _check_reuse(env, fresh_task, seed, fresh, f"{action!r} as the first action of {task!r}", fail):
            return


def check_env(env: TextEnv, *, seed: int = 0) -> None:
    """Check a freshly made environment against the TextEnv contract; raise EnvCheckError listing failures."""
    failures = env_failures(env, seed=seed)
    if failures:
        raise EnvCheckError(getattr(getattr(env, "spec", None), "id", type(env).__name__), failures)


def env_failures(env: TextEnv, *, seed: int = 0) -> list[str]:
    """Every contract violation of a freshly made environment (empty when it conforms)."""
    failures: list[str] = []
    fail = failures.append
    try:
        _run_checks(env, seed, fail)
    except Exception as exc:  # noqa: BLE001 - a crash ends the check; it is itself a failure to report
        fail(f"unexpected {type(exc).__name__}: {exc}")
    return failures


def _run_checks(env: TextEnv, seed: int, fail: Callable[[str], None]) -> None:
    spec = getattr(env, "spec", None)
    if not isinstance(spec, EnvSpec):
        fail(f"env.spec must be an EnvSpec, got {type(spec).__name__}")
        return
    if not isinstance(spec.max_steps, int) or spec.max_steps < 1:
        fail(f"spec.max_steps must be a positive int, got {spec.max_steps!r}")
        return
    if spec.family not in FAMILIES:
        fail(f"spec.family must be one of {', '.join(FAMILIES)}, got {spec.family!r}")

    tasks = {}
    for split in SPLITS:
        try:
            tasks[split] = env.tasks(split)
        except MissingSplitError as exc:  # the other splits are still checked
            fail(str(exc))
    for split, ids in tasks.items():
        if len(ids) == 0:
            fail(f"tasks({split!r}) is empty")
            return
        if not all(isinstance(t, str) for t in ids[:100]):
            fail(f"tasks({split!r}) must hold str task ids")
            return
    for first, second in combinations(tasks, 2):
        if set(tasks[first][:200]) & set(tasks[second][:200]):
            fail(f"{first} and {second} task ids overlap")
    if list(env.tasks("train")[:20]) != list(tasks["train"][:20]):
        fail("tasks('train') is not reproducible")
    try:
        env.tasks("validation-typo")
        fail("tasks() accepted an unknown split name; it must raise ValueError")
    except ValueError:
        pass

    try:
        env.step(_fallback_action(env))
        fail("step() before reset() must raise ResetNeededError")
    except ResetNeededError:
        pass

    task = tasks["train"][0]
    first = env.reset(task_id=task)
    if not (isinstance(first, tuple) and len(first) == 2):
        fail(f"reset() must return (observation, info), got {type(first).__name__}")
        return
    observation, info = first
    if not isinstance(observation, str):
        fail(f"reset(): observation must be a str, got {type(observation).__name__}")
    _check_info("reset()", info, fail)
    # the first episode this (fresh) instance plays, on an eval task: replayed after the train task's episodes
    fresh_task = tasks["eval"][0]
    fresh = _trace(env, fresh_task, seed, None, random.Random(seed))
    again, info_again = env.reset(task_id=task)
    if again != observation:
        fail(f"reset(task_id={task!r}) twice gave different observations")
    if (
        isinstance(info, dict)
        and isinstance(info_again, dict)
        and info.get("admissible_actions") != info_again.get("admissible_actions")
    ):
        fail(f"reset(task_id={task!r}) twice gave different admissible actions")
    if env.reset(seed=seed)[0] != env.reset(seed=seed)[0]:
        fail(f"reset(seed={seed}) twice gave different observations")
    for split in ("validation", "eval"):  # the held-out folds must be playable too
        if split in tasks:
            env.reset(task_id=tasks[split][0])

    # invalid input is answered by the game, not by an exception
    env.reset(task_id=task)
    _check_step("step(invalid action)", env.step(INVALID_ACTION), fail)

    # replay: the same actions from the same task give the same observations and rewards
    steps = min(spec.max_steps, 10)
    trace = _play(env, task, random.Random(seed), steps)
    if _play(env, task, random.Random(seed), steps) != trace:
        fail(f"replaying the same actions on {task!r} gave different observations or rewards")

    _check_episode(env, task, random.Random(seed), fail)
    if not _check_reuse(env, fresh_task, seed, fresh, f"episodes of {task!r}", fail):
        _check_first_actions(env, task, fresh_task, seed, fresh, fail)
    env.close()
    env.close()


def _check_episode(env: TextEnv, task: str, rng: random.Random, fail: Callable[[str], None]) -> None:
    """Play one episode to its end: types per step, truncation exactly at max_steps, no step after the end."""
    _, info = env.reset(task_id=task)
    max_steps = env.spec.max_steps
    for n in range(1, min(max_steps, MAX_CHECKED_STEPS) + 1):
        result = env.step(_pick_action(info, rng, env))
        if not _check_step(f"step {n}", result, fail):
            return
        info = result.info
        if result.truncated and n < max_steps:
            fail(f"step {n}: truncated before spec.max_steps={max_steps}")
        if n == max_steps and not (result.terminated or result.truncated):
            fail(f"step {n} = spec.max_steps: the episode must end (truncated=True)")
        if result.terminated or result.truncated:
            if isinstance(info, dict) and "won" not in info:
                fail(f"step {n}: the final step's info must carry 'won'")
            try:
                env.step(_fallback_action(env))
                fail("step() after the episode ended must raise ResetNeededError")
            except ResetNeededError:
                pass
            return


def cli_check(env_id: str, *, episodes: int = 1, seed: int = 0, **kwargs: Any) -> list[str]:
    """What `agent-runtime envs check ENV_ID` runs: make, check_env, then `episodes` episodes of random
    admissible actions on fresh instances. Returns the failures (empty = pass); never raises for the env's faults.
    """
    from environments.registry import make

    try:
        env = make(env_id, **kwargs)
    except Exception as exc:  # noqa: BLE001 - reported as a failure, like every other fault
        return [f"make({env_id!r}) failed: {type(exc).__name__}: {exc}"]
    failures = env_failures(env, seed=seed)
    env.close()
    rng = random.Random(seed)
    for episode in range(episodes):
        env = make(env_id, **kwargs)
        try:
            train = env.tasks("train")
            task = train[rng.randrange(len(train))]
            _check_episode(env, task, rng, failures.append)
        except Exception as exc:  # noqa: BLE001 - reported as a failure
            failures.append(f"random episode {episode}: {type(exc).__name__}: {exc}")
        finally:
            env.close()
    return failures
