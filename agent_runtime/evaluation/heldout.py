"""Evaluation that cannot leak: held-out tasks never reach what the agent learns from.

What is held out: every task an evaluation plays, that is the first `evaluation.episodes_per_env` (or the
cycle's `opcd.eval_episodes`, whichever is more) tasks of each environment's eval split, for the run's
environments and its retention environments. Each is known by its task id and by the SHA-256 of its first
observation (played with its evaluation seed), because the same game or problem can stand under two ids
(a plugin whose splits overlap, a problem set with duplicates, a store that came in with `memory import`).

Where it is enforced: where the pools of learning material are built. EXTRACT's episodes and their
contrastive partners, an OPCD cycle's prompts and the retrieved examples go through `HeldOut.usable`, so a
held-out task's episode is left out; `HeldOut.check` is the last line, an `EvalLeakError` (not a warning)
if one is about to be used anyway. A system-prompt cycle's prompt file holds no episodes: a line whose first
user turn holds a held-out opening is refused when it is read (`HeldOut.task_in`, `agent_runtime.phases.system_prompt`).
Retrieval never returns the task being played either: not its task id, nor the same opening under another id,
unless that opening does not identify a game (`HeldOut.identifies`).

`held_out(config, workdir)` builds the set once per process (it resets each evaluation task once; the
games are generated and cached as evaluation would generate them anyway). `leak_report` is what
`agent-runtime eval` prints: how many held-out tasks the run's stored experience holds, whether any live
lesson's provenance or the acting adapter's training episodes touch one, and whether a decision played one.

A decision (the gate and the trials of induced lessons: their gate rows' games; a cycle's promotion: its validation
games) must not play a game a table reports, or the lessons and adapters it let through are measured on the games
they were chosen on. `decisions_on_reported` finds such games in the store alone (against the games its stored
held-out evaluations played, or a `HeldOut` set), for `eval`, `report` and the cycle table the run prints; a run
stored when the gate's split defaulted to `eval` is caught the same way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from agent_runtime.config import ConfigError, RunConfig
from agent_runtime.episode.build import build_envs
from agent_runtime.episode.openings import normal_text, observation_hash
from memory import EVALUATION_EVAL, EVALUATION_GATE, EpisodeInfo, ExperienceStore


class EvalLeakError(RuntimeError):
    """A held-out evaluation task was about to become learning material; nothing was used."""


@dataclass(frozen=True)
class HeldOut:
    """The run's held-out tasks, by (env id, task id) and by (env id, first-observation hash); and the openings
    that several tasks of an environment show (a game whose opening is the same for every task)."""

    tasks: frozenset[tuple[str, str]]
    first_observations: frozenset[tuple[str, str]]
    common_openings: frozenset[tuple[str, str]] = frozenset()
    opening_texts: tuple[tuple[str, str, str], ...] = ()  # (env id, task id, normal text) of those that identify one

    @property
    def size(self) -> int:
        return len(self.tasks)

    def _first_observation(self, episode: EpisodeInfo) -> str | None:
        steps = getattr(episode, "steps", None)
        return steps[0].observation if steps else None

    def holds(self, env_id: str, task_id: str, first_observation: str | None = None) -> bool:
        if (env_id, task_id) in self.tasks:
            return True
        return (
            first_observation is not None and (env_id, observation_hash(first_observation)) in self.first_observations
        )

    def identifies(self, env_id: str, opening_hash: str) -> bool:
        """Whether an opening tells one game of `env_id` from another: not one that several tasks show."""
        return (env_id, opening_hash) not in self.common_openings

    def task_in(self, text: str) -> tuple[str, str] | None:
        """The held-out task (env id, task id) whose opening `text` is or holds, whitespace aside; None if none.
        For text that did not come from an episode (a prompt file): a rendered prompt holds its opening."""
        normal = normal_text(text)
        return next(((env_id, task_id) for env_id, task_id, opening in self.opening_texts if opening in normal), None)

    def usable(self, episode: EpisodeInfo) -> bool:
        """Whether an episode may be learned from (an episode loaded with its steps is checked by content too)."""
        return not self.holds(episode.env_id, episode.task_id, self._first_observation(episode))

    def check(self, episodes, what: str) -> None:
        """Raise `EvalLeakError` if any of `episodes` is a held-out task; `what` names the pool."""
        leaked = [e for e in episodes if not self.usable(e)]
        if leaked:
            shown = ", ".join(f"episode {e.id} ({e.env_id} {e.task_id!r})" for e in leaked[:5])
            raise EvalLeakError(
                f"{what}: {len(leaked)} held-out evaluation task(s) would be used: {shown}; "
                "they are left out of every pool of learning material"
            )


_CACHE: dict[tuple[str, str], HeldOut] = {}


def held_out(config: RunConfig, workdir: Path) -> HeldOut:
    """The held-out tasks of `config`'s evaluation (built once per process and config)."""
    n = max(config.evaluation.episodes_per_env, config.opcd.eval_episodes or 0)
    envs = [*config.envs, *config.opcd.retention_envs]
    key = (
        json.dumps([e.model_dump(mode="json") for e in envs] + [n, config.evaluation.seed], sort_keys=True),
        str(Path(workdir).resolve()),
    )
    if key not in _CACHE:
        _CACHE[key] = _build(config.model_copy(update={"envs": envs}), Path(workdir), n)
    return _CACHE[key]


def _build(config: RunConfig, workdir: Path, n: int) -> HeldOut:
    """Reset each held-out task once for its first observation. An observation that the first `n` train
    tasks show too does not tell a held-out game from a training one (a game whose opening is the same for
    every task), so it is not used to recognise one; the task id still is. An opening that two of these tasks
    show is a common opening of the environment."""
    specs, task_lists = build_envs(config, workdir, split="eval")
    _, train_lists = build_envs(config, workdir, split="train")
    tasks, observations, common, texts = set(), set(), set(), []
    for spec, task_ids, train_ids in zip(specs, task_lists, train_lists):
        env = spec.factory()
        try:
            shown_by: dict[str, set[str]] = {}  # opening hash -> the tasks that show it
            held = {}  # opening hash -> (task id, normal text)
            for i, task_id in enumerate(list(task_ids[:n])):
                tasks.add((spec.env_id, task_id))
                text = normal_text(env.reset(seed=config.evaluation.seed + i, task_id=task_id)[0])
                opening = observation_hash(text)
                held[opening] = (task_id, text)
                shown_by.setdefault(opening, set()).add(task_id)
            shared = set()
            for i, task_id in enumerate(list(train_ids[:n])):
                if (spec.env_id, task_id) not in tasks:  # a plugin whose splits overlap: the id decides
                    opening = observation_hash(env.reset(seed=i, task_id=task_id)[0])
                    shared.add(opening)
                    shown_by.setdefault(opening, set()).add(task_id)
            observations |= {(spec.env_id, h) for h in held if h not in shared}
            texts += [(spec.env_id, *held[h]) for h in held if h not in shared and held[h][1]]
            common |= {(spec.env_id, h) for h, shown in shown_by.items() if len(shown) > 1}
        finally:
            env.close()
    return HeldOut(frozenset(tasks), frozenset(observations), frozenset(common), tuple(texts))


class FoldOverlapError(ConfigError):
    """A decision's fold holds a train or held-out game: refused before the run plays anything."""


def decision_folds(config: RunConfig) -> dict[str, int]:
    """{split: games the run's decisions play there per environment}: the promotion's validation games and their
    recheck, the gate's games."""
    folds: dict[str, int] = {}
    if config.opcd.enabled and config.opcd.validation_games:
        split = config.opcd.validation_split
        folds[split] = max(folds.get(split, 0), config.opcd.validation_games + config.opcd.recheck_games)
    if config.lessons.enabled and config.lessons.gate_episodes:
        for split in {config.lessons.gate_split, config.lessons.trial_split}:
            folds[split] = max(folds.get(split, 0), config.lessons.gate_episodes)
    return folds


def check_folds(config: RunConfig, workdir: Path) -> list[str]:
    """Refuse a decision fold other than train that shares a game with the train or the held-out fold: by task id
    (every task of the other folds) and by opening (the games the decisions play, against the held-out games' openings
    that identify a game: `HeldOut.first_observations`). Returns a warning per environment whose fold holds fewer
    games than its decisions ask for (they then play what there is)."""
    folds = {split: n for split, n in decision_folds(config).items() if split != "train"}
    if not folds:
        return []
    envs = [*config.envs, *config.opcd.retention_envs]
    whole = config.model_copy(update={"envs": envs})
    held = held_out(config, workdir)
    _, train_lists = build_envs(whole, workdir, split="train")
    specs, eval_lists = build_envs(whole, workdir, split="eval")
    warnings, overlaps = [], []
    for split, needed in folds.items():
        _, fold_lists = build_envs(whole, workdir, split=split)
        for spec, fold, train, held_ids in zip(specs, fold_lists, train_lists, eval_lists):
            shared = sorted((set(fold) & set(train)) | (set(fold) & set(held_ids)))
            if shared:
                overlaps.append(f"{spec.env_id}: its {split} fold holds train or held-out tasks {shared[:5]}")
                continue
            if len(fold) < needed:
                warnings.append(
                    f"{spec.env_id}: its {split} fold holds {len(fold)} games and the decisions ask for {needed}; "
                    f"they play {len(fold)}"
                )
            env = spec.factory()
            try:
                for i, task_id in enumerate(list(fold[:needed])):
                    opening = observation_hash(
                        normal_text(env.reset(seed=config.evaluation.seed + i, task_id=task_id)[0])
                    )
                    if (spec.env_id, opening) in held.first_observations:
                        overlaps.append(f"{spec.env_id}: {split} task {task_id!r} opens as a held-out game does")
                        break
            finally:
                env.close()
    if overlaps:
        raise FoldOverlapError(
            "a decision's games must be none of the train or held-out ones (the tables would then report games a "
            "decision was fitted on): " + "; ".join(overlaps)
        )
    return warnings


Game = tuple[str, str, int]  # (env id, task id, seed)


def decision_games(store: ExperienceStore, run_id: int) -> dict[str, set[Game]]:
    """The games the run's decisions played, by what played them: each gate row (the gate's and the induced
    lessons' trials; its `keys`) and each cycle's validation games (its `validation_*` conditions)."""
    out: dict[str, set[Game]] = {}
    for row in store.evaluations(run_id, kind=EVALUATION_GATE):
        keys = [k for k in row.metrics.get("keys", []) if isinstance(k, list) and len(k) == 3]
        out.setdefault(f"gate row {row.id}", set()).update((str(e), str(t), int(s)) for e, t, s in keys)
    for row in store.evaluations(run_id, kind=EVALUATION_EVAL):
        if str(row.metrics.get("condition", "")).startswith("validation_"):
            games = {(row.env_id, str(e["task_id"]), int(e["seed"])) for e in row.metrics.get("episodes", [])}
            out.setdefault(f"cycle {row.cycle_id}'s validation games", set()).update(games)
    return {source: games for source, games in out.items() if games}


def reported_games(store: ExperienceStore, run_id: int) -> set[tuple[str, str]]:
    """(env id, task id) of every game the run's stored held-out evaluations played (`eval`, a cycle's table, the
    continual matrix)."""
    return {
        (row.env_id, str(e["task_id"]))
        for row in store.evaluations(run_id, kind=EVALUATION_EVAL)
        if row.split == "eval"
        for e in row.metrics.get("episodes", [])
    }


def decisions_on_reported(store: ExperienceStore, run_id: int, held: HeldOut | None = None) -> list[str]:
    """One line per decision that played a game a table reports: one of `held` (the games about to be reported), or
    of the run's stored held-out evaluations; empty when none did."""
    reported = reported_games(store, run_id)
    lines = []
    for source, games in decision_games(store, run_id).items():
        hit = sorted(g for g in games if (held is not None and held.holds(g[0], g[1])) or g[:2] in reported)
        if hit:
            shown = ", ".join(f"{env} {task!r} seed {seed}" for env, task, seed in hit[:3])
            more = f" and {len(hit) - 3} more" if len(hit) > 3 else ""
            lines.append(f"{source} played {len(hit)} held-out game(s): {shown}{more}")
    return lines


def decisions_line(lines: list[str]) -> str:
    """What a table's reader must know when a decision played its games (empty when none did)."""
    if not lines:
        return ""
    return (
        "NOT CLEAN: decisions played the held-out games this table reports, so what they let through is measured on "
        "the games it was chosen on: " + "; ".join(lines)
    )


@dataclass
class LeakReport:
    held_out: int
    stored_episodes: int
    leaked_episodes: list[int]
    leaked_lessons: list[int]
    leaked_adapter_episodes: list[int]
    decisions_on_held_out: list[str] = field(default_factory=list)  # `decisions_on_reported`'s lines

    @property
    def clean(self) -> bool:
        return not (self.leaked_lessons or self.leaked_adapter_episodes or self.decisions_on_held_out)

    def line(self) -> str:
        head = (
            f"leak check: {self.held_out} held-out tasks (task id and first observation) against "
            f"{self.stored_episodes} stored episodes of the run: {len(self.leaked_episodes)} held-out "
            "episode(s) in the store (never learned from)"
        )
        if self.clean:
            return head + "; no live lesson and no acting adapter learned from one, and no decision played one"
        learned = ""
        if self.leaked_lessons or self.leaked_adapter_episodes:
            learned = (
                f"; LEAKED: lessons {self.leaked_lessons} come from held-out episodes, the acting adapter "
                f"trained on held-out episodes {self.leaked_adapter_episodes}"
            )
        decided = f"; {decisions_line(self.decisions_on_held_out)}" if self.decisions_on_held_out else ""
        return head + learned + decided


def leak_report(store: ExperienceStore, run_id: int, held: HeldOut, adapter=None) -> LeakReport:
    """How the run's stored experience stands against the held-out tasks (for `agent-runtime eval`)."""
    from distill.lessons import live_lessons

    episodes = store.episodes(run_id, limit=max(store.count_episodes(run_id), 1))
    suspects = [e for e in episodes if not held.usable(e)]
    by_content = [
        e.id for e in episodes if e.id not in {s.id for s in suspects} and not held.usable(store.episode(e.id))
    ]
    leaked = sorted({e.id for e in suspects} | set(by_content))
    _, lessons = live_lessons(store, run_id)
    bad_lessons = sorted(x.id for x in lessons if set(x.source_episode_ids) & set(leaked))
    trained = set()
    if adapter is not None and adapter.id is not None:
        for cycle in store.cycles(run_id):
            if cycle.adapter_id == adapter.id:
                trained |= set(cycle.episode_ids)
    decided = decisions_on_reported(store, run_id, held)
    return LeakReport(held.size, len(episodes), leaked, bad_lessons, sorted(trained & set(leaked)), decided)
