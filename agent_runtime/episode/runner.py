"""The episode runner: N environment slots stepped together, one batched generate per turn.

Every live slot contributes one prompt to a single `backend.generate` call per turn, so the model sees a
batch as wide as the number of slots (this is where the throughput comes from on both CPU and GPU). When an
episode ends, its slot is refilled with the next task from the sampler; the finished episode is handed to
`on_episode` at once, so the loop can commit it before anything else happens.

Tasks come from a `TaskSampler` that is a pure function of (run seed, draw index): draw k is always the same
environment, task and seed. The loop persists only counters (the next draw index and the draws still in
flight), which makes `--resume` exact without pickling random-number generators.

Every other draw of an episode is seeded the same way, by (run seed, draw index, turn): `turn_seed` is the one key,
for the policy (each row of the batched call gets its own seed, `SamplingParams.seeds`, so what a slot samples
depends neither on the slots beside it nor on the calls before) and for exploration. A killed and resumed run plays
every episode as the run never killed did. A backend that cannot seed a row by itself (not a `RowSeededBackend`:
a remote chat API) cannot promise that; its episodes record `replays: false` in their metadata.

Failures inside an episode are data: an environment that raises in reset or step ends that episode with
outcome "error" and the message, and the run goes on with a fresh environment instance in that slot.

An environment's text is kept within the caps of `environments.base` as it arrives (`_kept`): an observation or goal
over `MAX_OBSERVATION_CHARS` is cut with a marker before the prompt, the examples, the lessons' choice or the store
see it, an admissible action over `MAX_ACTION_CHARS` is not offered, and the step's info says what was cut
(`observation_chars`: the length the game sent; `goal_chars`; `admissible_dropped`: how many actions were left out).

Instances can be lent (`EnvLender`, as evaluation's pool of started games does): a slot borrows one instead of
building it, and `close` hands the ones between episodes back; every episode starts with a `reset` onto its task
and seed either way, and a broken instance (a failed reset or step) is closed, never handed back.

An instance is kept per slot and environment, and a game's can hold a large JVM: with `plays` (a draw's index ->
the environments its curriculum phase plays, `CurriculumConfig.plays`), an instance between episodes of an environment the
next draw's phase does not play is closed when that draw starts, so a runner that lives across phases (a Ray rollout
worker's) holds only the coming phase's games.

Which weights acted: when an episode starts, the runner asks the backend for the fingerprint of the adapter
weights it has loaded (`FingerprintBackend`), and the episode record carries it next to `adapter_id` (the
adapter the run meant), so that an episode played with other weights than its adapter's is visible.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Protocol

from agent_runtime.episode.prompt import PromptBuilder, Turn, parse_action
from agent_runtime.llm.base import (
    ChoiceBackend,
    FingerprintBackend,
    PolicyBackend,
    RowSeededBackend,
    SamplingParams,
    derive_seed,
    require,
)
from distill.lessons.safety import replace_lone_surrogates
from environments.base import MAX_ACTION_CHARS, MAX_OBSERVATION_CHARS, cap_text
from memory import EpisodeRecord, StepRecord

INVALID_ACTION_FEEDBACK = "That reply did not contain a valid action. Reply with one command."


@dataclass(frozen=True)
class Draw:
    index: int
    env_index: int
    task_id: str
    seed: int


class TaskSampler:
    """Draw k = (environment by mixing weight, task uniformly from its train split, episode seed)."""

    def __init__(
        self,
        weights: Sequence[float],
        task_lists: Sequence[Sequence[str]],
        seed: int,
        weights_for: Callable[[int], Sequence[float]] | None = None,
    ):
        assert len(weights) == len(task_lists) and weights, "one weight per environment"
        empty = [i for i, tasks in enumerate(task_lists) if not tasks]
        if empty:
            raise ValueError(f"environment #{empty[0]} has no train tasks")
        self.weights = list(weights)
        self.task_lists = [list(t) for t in task_lists]
        self.seed = seed
        self.weights_for = weights_for  # draw index -> weights (a curriculum's phase), else `weights` for every draw

    def draw(self, index: int) -> Draw:
        rng = random.Random(f"{self.seed}:{index}")
        weights = self.weights if self.weights_for is None else self.weights_for(index)
        env_index = rng.choices(range(len(self.weights)), weights=weights)[0]
        tasks = self.task_lists[env_index]
        return Draw(index, env_index, tasks[rng.randrange(len(tasks))], rng.randrange(2**31))


def turn_seed(run_seed: int, draw_index: int, turn: int, purpose: str) -> int:
    """The seed of one draw of PLAY: `purpose` ("act": the policy's sample, "explore": whether and what it
    explores) at `turn` of draw `draw_index` of the run seeded `run_seed`; nothing else goes into it."""
    return derive_seed(run_seed, draw_index, turn, purpose)


@dataclass
class EnvSlotSpec:
    """How to build an environment instance of one mixture entry, and how to talk to it."""

    env_id: str
    factory: Callable[[], object]
    family: str
    max_steps: int


@dataclass(frozen=True)
class EpisodeContext:
    """What an episode carries in its prompt besides the game: the lessons and the set they came from."""

    lessons: tuple[str, ...] = ()
    lesson_ids: tuple[int, ...] = ()
    version: int | None = None


NO_CONTEXT = EpisodeContext()


class EnvLender(Protocol):
    """Where a runner's slots get their environment instances (instead of `EnvSlotSpec.factory`) and where
    `EpisodeRunner.close` hands back the ones left between episodes."""

    def borrow(self, env_index: int) -> object: ...

    def give_back(self, env_index: int, env: object) -> None: ...


@dataclass
class _Episode:
    draw: Draw
    env: object
    observation: str
    info: dict
    started_at: datetime
    context: EpisodeContext = NO_CONTEXT
    examples: list[str] = field(default_factory=list)
    history: list[Turn] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    total_return: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    fingerprint: str | None = None  # of the adapter weights the backend had loaded when the episode started
    cut: dict[str, int] = field(default_factory=dict)  # what `_kept` cut of `observation` and `info`


def _now() -> datetime:
    return datetime.now(UTC)


def _kept(observation: str, info: dict | None) -> tuple[str, dict, dict[str, int]]:
    """An observation and its info as the runtime keeps them (the caps of `environments.base`), with what was cut:
    the observation's and the goal's lengths when they were cut, how many admissible actions were too long to offer.
    Cut first, then made valid Unicode (before the tokenizer and the store)."""
    info, cut = dict(info or {}), {}
    if len(observation) > MAX_OBSERVATION_CHARS:
        cut["observation_chars"] = len(observation)
    observation = replace_lone_surrogates(cap_text(observation, MAX_OBSERVATION_CHARS))
    goal = info.get("goal")
    if isinstance(goal, str) and len(goal) > MAX_OBSERVATION_CHARS:
        cut["goal_chars"], info["goal"] = len(goal), cap_text(goal, MAX_OBSERVATION_CHARS)
    actions = info.get("admissible_actions")
    if isinstance(actions, list):
        offered = [a for a in actions if not isinstance(a, str) or len(a) <= MAX_ACTION_CHARS]
        if len(offered) < len(actions):
            cut["admissible_dropped"], info["admissible_actions"] = len(actions) - len(offered), offered
    return observation, info, cut


class EpisodeRunner:
    def __init__(
        self,
        backend: PolicyBackend,
        envs: list[EnvSlotSpec],
        builders: list[PromptBuilder],
        params: SamplingParams,
        *,
        slots: int = 1,
        policy_name: str = "",
        adapter_id: int | None = None,
        context_for: Callable[[Draw], EpisodeContext] | None = None,
        examples_for: Callable[[str, str, str], list[str]] | None = None,
        explore: float = 0.0,
        lender: EnvLender | None = None,
        choose_lessons: Callable[[EpisodeContext, str, str, str], EpisodeContext] | None = None,
        seed: int = 0,
        plays: Callable[[int], Collection[int]] | None = None,
    ):
        """`seed`: the run seed, which with a draw's index and the turn seeds every draw of a turn (`turn_seed`).
        `plays`: a draw's index -> the environments its phase plays; the others' instances are closed (see above)."""
        assert len(envs) == len(builders), "one prompt builder per environment"
        assert 0.0 <= explore <= 1.0, f"explore is a share of decisions, got {explore}"
        if any(b.action_mode == "choice" for b in builders):
            require(backend, ChoiceBackend, "agent.action_mode choice (set agent.action_mode: free otherwise)")
        self.backend = backend
        self.envs = envs
        self.builders = builders
        self.params = params
        self.slots = slots
        self.policy_name = policy_name
        self.adapter_id = adapter_id
        self.context_for = context_for or (lambda draw: NO_CONTEXT)
        self.examples_for = examples_for
        # (context, env id, goal, first observation) -> the lessons the episode shows, once its game is reset
        self.choose_lessons = choose_lessons
        self.explore = explore  # share of choice decisions drawn uniformly from the set (PLAY's exploration)
        self.lender = lender
        self.plays = plays
        self.seed = seed
        self.replays = isinstance(backend, RowSeededBackend)
        self._instances: list[dict[int, object]] = [{} for _ in range(slots)]
        self._live: list[_Episode | None] = [None] * slots

    def in_flight(self) -> list[int]:
        return sorted(ep.draw.index for ep in self._live if ep is not None)

    def _env(self, slot: int, env_index: int):
        if env_index not in self._instances[slot]:
            self._instances[slot][env_index] = (
                self.lender.borrow(env_index) if self.lender is not None else self.envs[env_index].factory()
            )
        return self._instances[slot][env_index]

    def _release_unplayed(self, index: int) -> None:
        """Close every slot's instances, between episodes, of the environments draw `index`'s phase does not play."""
        playing = set(self.plays(index))
        busy = {id(ep.env) for ep in self._live if ep is not None}
        for slot, instances in enumerate(self._instances):
            for env_index in [e for e, env in instances.items() if e not in playing and id(env) not in busy]:
                self._drop_env(slot, env_index)

    def _drop_env(self, slot: int, env_index: int) -> None:
        env = self._instances[slot].pop(env_index, None)
        if env is not None:
            # a broken env's close must not take the run down; the episode already says why
            with contextlib.suppress(Exception):
                env.close()

    def _record(self, ep: _Episode, outcome: str, won: bool, error: str | None = None) -> EpisodeRecord:
        spec = self.envs[ep.draw.env_index]
        metadata = {"draw": ep.draw.index, "final_observation": ep.observation}
        if not self.replays:
            metadata["replays"] = False
        if "observation_chars" in ep.cut:
            metadata["final_observation_chars"] = ep.cut["observation_chars"]
        if "goal_chars" in ep.cut:
            metadata["goal_chars"] = ep.cut["goal_chars"]
        return EpisodeRecord(
            env_id=spec.env_id,
            task_id=ep.draw.task_id,
            seed=ep.draw.seed,
            policy=self.policy_name,
            adapter_id=self.adapter_id,
            lesson_set_version=ep.context.version,
            outcome=outcome,
            won=won,
            total_return=ep.total_return,
            prompt_tokens=ep.prompt_tokens,
            completion_tokens=ep.completion_tokens,
            started_at=ep.started_at,
            ended_at=_now(),
            error=cap_text(error, MAX_OBSERVATION_CHARS) if error is not None else None,
            goal=ep.info.get("goal"),
            lessons_in_context=list(ep.context.lesson_ids),
            metadata=metadata,
            steps=ep.steps,
            adapter_fingerprint=ep.fingerprint,
        )

    def _start(self, slot: int, draw: Draw) -> EpisodeRecord | None:
        """Reset an environment onto the draw; a failing reset is returned as an errored episode."""
        started = _now()
        context = self.context_for(draw)
        fingerprint = self.backend.adapter_fingerprint() if isinstance(self.backend, FingerprintBackend) else None
        if self.plays is not None:
            self._release_unplayed(draw.index)
        try:
            env = self._env(slot, draw.env_index)
            observation, info, cut = _kept(*env.reset(seed=draw.seed, task_id=draw.task_id))
        except Exception as exc:  # noqa: BLE001 -- any environment's reset failure is an errored episode
            self._drop_env(slot, draw.env_index)
            ep = _Episode(draw, None, "", {}, started, context, fingerprint=fingerprint)
            return self._record(ep, "error", False, f"reset failed: {type(exc).__name__}: {exc}")
        env_id = self.envs[draw.env_index].env_id
        if self.choose_lessons is not None and context.lessons:
            context = self.choose_lessons(context, env_id, str((info or {}).get("goal") or ""), observation)
        examples = self.examples_for(env_id, draw.task_id, observation) if self.examples_for else []
        self._live[slot] = _Episode(
            draw, env, observation, info, started, context, examples, fingerprint=fingerprint, cut=cut
        )
        return None

    def run(
        self,
        next_draw: Callable[[], Draw | None],
        on_episode: Callable[[EpisodeRecord], None],
        should_stop: Callable[[], bool] = lambda: False,
    ) -> None:
        """Play until `next_draw` runs dry and every slot is idle, or until `should_stop` says so.

        On a stop request the current turn is finished and its ended episodes are handed over; episodes
        still in flight are abandoned (their draws stay in `in_flight()` for the caller to persist).
        """
        while True:
            stopping = should_stop()
            if not stopping:
                for slot in range(self.slots):
                    while self._live[slot] is None:
                        draw = next_draw()
                        if draw is None:
                            break
                        errored = self._start(slot, draw)
                        if errored is not None:
                            on_episode(errored)
            live = [s for s in range(self.slots) if self._live[s] is not None]
            if not live or stopping:
                return
            self._turn(live, on_episode)

    def _turn(self, live: list[int], on_episode: Callable[[EpisodeRecord], None]) -> None:
        chats, offered = [], []
        for slot in live:
            ep = self._live[slot]
            builder = self.builders[ep.draw.env_index]
            lessons = list(ep.context.lessons) if ep.context is not NO_CONTEXT else None
            options = builder.choices(ep.info.get("admissible_actions"))
            offered.append(options)
            chats.append(
                builder.build(
                    ep.history, ep.observation, options or ep.info.get("admissible_actions"), lessons, ep.examples
                )
            )
        seeds = [turn_seed(self.seed, self._live[s].draw.index, len(self._live[s].steps), "act") for s in live]
        completions = self._act(chats, offered, seeds)
        for slot, completion, options in zip(live, completions, offered):
            ep = self._live[slot]
            spec = self.envs[ep.draw.env_index]
            admissible = options or ep.info.get("admissible_actions")
            explore = random.Random(turn_seed(self.seed, ep.draw.index, len(ep.steps), "explore"))
            explored = bool(options) and self.explore > 0 and explore.random() < self.explore
            if explored:
                completion.text = explore.choice(options)
            action = completion.text if options else parse_action(spec.family, completion.text, admissible)
            ep.prompt_tokens += completion.prompt_tokens
            ep.completion_tokens += completion.completion_tokens
            error = None
            if action is None:
                observation, reward, terminated, truncated, info = (
                    INVALID_ACTION_FEEDBACK,
                    0.0,
                    False,
                    False,
                    dict(ep.info),
                )
                cut = {k: v for k, v in ep.cut.items() if k != "observation_chars"}  # the same info, already kept
            else:
                try:
                    observation, reward, terminated, truncated, info = ep.env.step(action)
                    observation, info, cut = _kept(observation, info)
                except Exception as exc:  # noqa: BLE001 -- any environment's step failure ends its episode
                    error = f"step failed: {type(exc).__name__}: {exc}"
                    observation, reward, terminated, truncated, info, cut = "", 0.0, False, False, {}, {}
            step_info = {k: v for k, v in (info or {}).items() if k in ("won", "score", "max_score")} | ep.cut
            step_info["action_mode"] = "choice" if options else "free"
            if explored:
                step_info["explored"] = True
            if completion.choice_logprobs is not None:
                step_info["choice_logprobs"] = [round(x, 6) for x in completion.choice_logprobs]
            ep.steps.append(
                StepRecord(
                    index=len(ep.steps),
                    observation=ep.observation,
                    prompt=completion.prompt_text,
                    response=completion.text,
                    action=action,
                    valid_action=action is not None,
                    reward=float(reward),
                    admissible_actions=list(admissible) if admissible is not None else None,
                    prompt_tokens=completion.prompt_tokens,
                    completion_tokens=completion.completion_tokens,
                    latency_s=completion.latency_s,
                    info=step_info,
                )
            )
            ep.total_return += float(reward)
            ep.history.append(Turn(ep.observation, completion.text, list(admissible) if admissible else None))
            ep.observation, ep.info, ep.cut = observation, dict(info or {}), cut
            if error is not None:
                self._live[slot] = None
                self._drop_env(slot, ep.draw.env_index)
                on_episode(self._record(ep, "error", False, error))
            elif terminated:
                won = bool(ep.info.get("won", False))
                self._live[slot] = None
                on_episode(self._record(ep, "won" if won else "lost", won))
            elif truncated or len(ep.steps) >= spec.max_steps:
                self._live[slot] = None
                on_episode(self._record(ep, "truncated", False))

    def _act(self, chats: list, offered: list[list[str] | None], seeds: list[int]) -> list:
        """One batched call per way of acting: `choose` for the rows with a choice set, `generate` for the rest;
        each row sampled with its own seed."""
        out: list = [None] * len(chats)
        choice_rows = [i for i, options in enumerate(offered) if options]
        free_rows = [i for i, options in enumerate(offered) if not options]
        if choice_rows:
            params = replace(self.params, seeds=tuple(seeds[i] for i in choice_rows))
            chosen = self.backend.choose([chats[i] for i in choice_rows], [offered[i] for i in choice_rows], params)
            for i, completion in zip(choice_rows, chosen):
                out[i] = completion
        if free_rows:
            params = replace(self.params, seeds=tuple(seeds[i] for i in free_rows))
            for i, completion in zip(free_rows, self.backend.generate([chats[i] for i in free_rows], params)):
                out[i] = completion
        return out

    def close(self, *, give_back: bool = True) -> None:
        """Close the instances left, or hand them back to the lender: only with `give_back` (False after a run
        that raised: an instance may have a request in flight) and only one between episodes."""
        busy = {id(ep.env) for ep in self._live if ep is not None}
        for instances in self._instances:
            for env_index, env in instances.items():
                if self.lender is not None and give_back and id(env) not in busy:
                    self.lender.give_back(env_index, env)
                    continue
                with contextlib.suppress(Exception):  # closing what is left: a broken env must not stop the rest
                    env.close()
        self._instances = [{} for _ in range(self.slots)]
