"""The EXTRACT phase as the loop runs it: wiring the extractor and curator to the run, and the gate.

The lesson logic itself (prompts, parsing, safety, curation, versions, the gate's rule, where a candidate's lessons
go live, which induced lessons go live) lives in `distill.lessons`; this module supplies what only the runtime has: a
policy to write the extractions (the acting model itself by default, or a configured LangChain chat model), the
model's tokenizer for the budget, and the games the gate plays (`lesson_trials`). With `gate_episodes > 0`
(`lessons.gated`), a new lesson set is first a *candidate*: the current live set and the candidate play the same
`lessons.gate_split` tasks with the same seeds (never the held-out ones the tables report), and the candidate goes
live only if it does not lower success by more than `gate_margin`; either way the decision is stored with its
numbers.

Lessons a person writes (`agent-runtime lessons add`, `lessons.seed` of a new run) enter through `add_lessons`, the
one function both the CLI and the loop call (the logic is `distill.lessons.user_lessons`). With the gate on
(`lessons.user_lessons_gated`: `enabled` and `gate_episodes > 0`) their version is a candidate, which the loop gates
before it next plays (`gate_user_lessons`; an EXTRACT phase that finds one still pending gates it first) -- the gate
needs the policy and the environments, which the CLI does not load; with the gate off it is live at once. Outside the
loop the budget is counted with the run model's tokenizer alone (`config_token_counter`), so the CLI never loads
weights.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from tqdm.auto import tqdm

from agent_runtime.config import RunConfig
from agent_runtime.llm.base import PolicyBackend, SamplingParams, TokenizerBackend
from agent_runtime.phases.lesson_trials import GameTrials, play_gate
from agent_runtime.state import Run
from agent_runtime.state.cursor import CursorMove
from agent_runtime.state.run import config_token_counter
from distill.evidence import trial_sight
from distill.lessons import (
    LessonCurator,
    LessonExtractor,
    UserAddResult,
    add_user_lessons,
    extract_phase,
    load_utilities,
    measure_utilities,
    pending_user_candidate,
    store_utilities,
)
from distill.lessons.scope import GLOBAL
from distill.lessons.selection import induce_and_select
from memory import ExperienceStore
from modelkit.chat_tokens import encode_text

log = logging.getLogger("agent_runtime.lessons")

PREFILL = "- EXPERIENCE ITEM:"  # a local model's answer starts here (render() continues a final assistant turn)


def text_token_counter(backend: PolicyBackend):
    """Tokens of a plain text in the acting model's tokenizer (whitespace words for a scripted policy), counted
    as the prompt will hold it: special-token text in a lesson is text there (`encode_text`), not one token."""
    if not isinstance(backend, TokenizerBackend) or backend.tokenizer is None:  # a chat model without one
        return lambda text: len(text.split())
    tokenizer = backend.tokenizer
    return lambda text: len(encode_text(tokenizer, text))


def add_lessons(
    config: RunConfig,
    store: ExperienceStore,
    run_id: int,
    texts: Sequence[str],
    *,
    backend: PolicyBackend | None = None,
    embedder=None,
    note: str = "",
    scope: Sequence[str] = GLOBAL,
) -> UserAddResult:
    """Add lessons a person wrote to every pool of the run (`distill.lessons.add_user_lessons`): a candidate
    for the gate the loop runs before it next plays when `config.lessons.user_lessons_gated`, else live. The budget
    is counted with `backend`'s tokenizer, or the configured model's when no backend is loaded."""
    count_tokens = text_token_counter(backend) if backend is not None else config_token_counter(config.model)
    return add_user_lessons(
        store,
        run_id,
        texts,
        config.lessons,
        count_tokens=count_tokens,
        embedder=embedder,
        candidate=config.lessons.user_lessons_gated,
        note=note,
        scope=scope,
    )


def add_seed_lessons(
    config: RunConfig, store: ExperienceStore, run_id: int, backend: PolicyBackend | None = None
) -> UserAddResult | None:
    """`lessons.seed` into a NEW run (the caller creates the run; a resumed run never comes here)."""
    if not config.lessons.seed:
        return None
    result = add_lessons(config, store, run_id, config.lessons.seed, backend=backend, note="lessons.seed")
    for item in result.items:
        if item.status != "added":
            log.warning("lessons.seed: %s %r: %s", item.status, item.text, item.reason)
    tqdm.write("lessons.seed: " + result.lines()[-1], file=sys.stderr)  # stdout may carry --json
    return result


def extractor_backend(config: RunConfig, policy: PolicyBackend) -> PolicyBackend:
    spec = config.lessons.extractor
    if spec == "policy":
        return policy
    from agent_runtime.llm.chat_backend import ChatBackend, load_chat_model

    return ChatBackend(load_chat_model(spec, {}))


@dataclass
class ExtractReport:
    episodes: int
    items: int
    empty: int
    rejected: int
    version: int | None
    gate: str | None
    contrastive: int = 0  # extractions that read a won/lost pair
    user_gate: str | None = None  # the gate's decision on a person's pending lessons, taken first
    induced: list[dict] | None = None  # method evidence|both: each induced lesson, its evidence and its trial
    trial_split: str = "train"  # the fold the induced lessons' trials played
    gate_split: str = "validation"  # the fold their go-live decision played

    def line(self) -> str:
        gate = f"; gate: {self.gate}" if self.gate else ""
        user = f"user lessons {self.user_gate}; " if self.user_gate else ""
        pairs = f", {self.contrastive} contrastive" if self.contrastive else ""
        where = f"lesson set v{self.version}" if self.version is not None else "no change to the lessons"
        if self.induced is not None and not self.items and self.gate is None:  # evidence only
            return (
                f"EXTRACT: {user}{self.episodes} episodes -> {len(self.induced)} lesson(s) induced from won/lost "
                f"evidence, {self._raised()} -> {where}"
            )
        induced = ""
        if self.induced is not None:
            induced = f"; induced {len(self.induced)}, {self._raised()}"
        return (
            f"EXTRACT: {user}{self.episodes} episodes -> {self.items} items ({self.empty} empty, "
            f"{self.rejected} rejected{pairs}) -> {where}{gate}{induced}"
        )

    def _raised(self) -> str:
        raised = [x for x in self.induced or [] if x["accepted"]]
        line = f"{len(raised)} raised success on trial"
        refused = sum(x.get("confirmed") is False for x in raised)
        return f"{line}, kept out on the {self.gate_split} games" if refused else line

    def trial_lines(self) -> list[str]:
        """One line per induced lesson: its text, its evidence, what its trial measured and what the trial's size can
        see (`distill.evidence.trial_sight`)."""

        def status(x: dict) -> str:
            if not x["accepted"]:
                return "kept out"
            return f"kept out on the {self.gate_split} games" if x.get("confirmed") is False else "live"

        return [
            f"  {status(x)}: {x['text']!r} ({x['evidence']['summary']}; "
            f"trial {x['trial']['current_rate']:.2f} -> {x['trial']['candidate_rate']:.2f} on "
            f"{x['trial']['n']} {self.trial_split} games, which see a gain of "
            f"{trial_sight(x['trial']['n']).change:.0%} 4 times in 5)"
            for x in self.induced or []
            if x["trial"]["n"]
        ]


def run_extract(
    run: Run, backend: PolicyBackend, episode_ids: list[int], *, finish: CursorMove | None = None
) -> ExtractReport:
    """Extract from `episode_ids`, curate into a new version, and (with a gate) promote or block it. A held-out
    evaluation task among `episode_ids` is an `EvalLeakError` before anything runs (`learnable_recent`
    chooses episodes that are not); contrastive partners are chosen among the others.

    Everything the phase writes (extractions, lessons, the version, the gate's decision) and `finish`, the
    run's cursor move, are one transaction: a process killed inside the phase leaves none of it, and one
    killed after it finds the cursor already moved, so the phase never runs twice."""
    with run.store.transaction():
        report = _extract(run, backend, episode_ids)
        if finish is not None:
            finish.apply(run.store, run.id)
    return report


def _extract(run: Run, backend: PolicyBackend, episode_ids: list[int]) -> ExtractReport:
    config, store, run_id, settings = run.config, run.store, run.id, run.config.lessons
    writer = extractor_backend(config, backend)
    params = SamplingParams(max_new_tokens=settings.max_new_tokens, temperature=settings.temperature)

    # a backend that renders its own chat template continues a final assistant turn; a remote chat model may not
    continues = isinstance(writer, TokenizerBackend)
    prefill = PREFILL if settings.prefill and settings.style == "structured" and continues else ""

    def complete(chats):
        if prefill:
            chats = [[*chat, {"role": "assistant", "content": prefill}] for chat in chats]
        return [prefill + c.text for c in writer.generate(chats, params)]

    count_tokens = text_token_counter(backend)
    utilities = measure_utilities(store, run_id, min_episodes=settings.utility_min_episodes)
    if utilities:
        store_utilities(store, run_id, utilities)
    extractor = LessonExtractor.from_settings(complete, settings, name=settings.extractor)
    curator = LessonCurator.from_settings(
        store, run_id, settings, count_tokens=count_tokens, utilities=load_utilities(store, run_id)
    )
    gated = settings.gated
    pending = pending_user_candidate(store, run_id)
    user_gate = None
    if gated and pending is not None:  # a person's lessons, added while the gate was on, are gated first
        user_gate = play_gate(run, backend, curator, pending.version).reason
    held = run.held
    held.check([store.episode(i) for i in episode_ids], "EXTRACT")
    report = ExtractReport(len(episode_ids), 0, 0, 0, None, None, 0, user_gate)
    if settings.method in ("model", "both"):
        result = extract_phase(
            store,
            run_id,
            episode_ids,
            extractor,
            curator,
            candidate=gated,
            batch=settings.extract_batch,
            contrastive=settings.contrastive,
            lookback=settings.contrastive_lookback,
            usable=held.usable,
        )
        version = result.curation.version if result.curation else None
        report.items = sum(len(r.proposals) for r in result.recorded)
        report.empty, report.rejected = result.empty_extractions, result.rejected_items
        report.contrastive = result.contrastive_extractions
        report.version = version.version if version else None
        if gated and version is not None:
            report.gate = play_gate(run, backend, curator, version.version).reason
    if settings.method in ("evidence", "both"):
        report.trial_split, report.gate_split = settings.trial_split, settings.gate_split
        report.induced, version = _induce(run, backend, curator, episode_ids, held.usable)
        report.version = version if version is not None else report.version
    return report


def _induce(
    run: Run, backend: PolicyBackend, curator: LessonCurator, episode_ids: list[int], usable
) -> tuple[list[dict], int | None]:
    """Lessons induced from the EXTRACT's episodes and the older ones it may look back on, each tried on the
    trials' games (`lessons.trial_split`) of its own environment, and the set the search chose confirmed on the gate's
    (`lessons.gate_split`), both played here (`GameTrials`); the search, what is stored and what goes live are
    `distill.lessons.selection.induce_and_select`'s."""
    store, run_id, settings = run.store, run.id, run.config.lessons
    read = [store.episode(i) for i in episode_ids]
    older = (
        [
            store.episode(e.id)
            for e in store.episodes(run_id, limit=settings.contrastive_lookback)
            if e.id not in set(episode_ids)
        ]
        if settings.contrastive_lookback
        else []
    )
    evidence = read + [e for e in older if usable(e)]
    search = GameTrials(run, backend, split=settings.trial_split)
    confirm = GameTrials(run, backend) if settings.confirms_on_gate_split else None
    return induce_and_select(store, run_id, curator, evidence, settings, search, confirm)


def learnable_recent(run: Run, n: int) -> list[int]:
    """The ids of the run's `n` newest episodes that may be learned from (held-out evaluation tasks left out)."""
    held, out, offset = run.held, [], 0
    while len(out) < n:
        page = run.store.episodes(run.id, limit=2 * n, offset=offset, newest_first=True)
        out += [e.id for e in page if held.usable(run.store.episode(e.id))][: n - len(out)]
        if len(page) < 2 * n:
            break
        offset += len(page)
    return sorted(out)


def gate_user_lessons(run: Run, backend: PolicyBackend) -> str | None:
    """Gate a person's pending lessons now (the loop calls this before it plays, so that `lessons.seed` and
    `lessons add` go live as soon as the gate lets them); the gate's reason, or None when nothing waited."""
    config, store, run_id = run.config, run.store, run.id
    if not config.lessons.user_lessons_gated or pending_user_candidate(store, run_id) is None:
        return None
    curator = LessonCurator.from_settings(
        store, run_id, config.lessons, count_tokens=text_token_counter(backend), utilities=load_utilities(store, run_id)
    )
    return play_gate(run, backend, curator, pending_user_candidate(store, run_id).version).reason
