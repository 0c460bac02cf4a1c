"""Lesson extraction: one trajectory + the current lessons -> a prompt -> 1-2 `- EXPERIENCE ITEM:` lines.

What:
- `build_prompt(episode, current, *, style, max_items, ...) -> list[dict]`: the extraction chat (one
  user message) for one stored episode (`memory.EpisodeInfo` with its steps) and the pool's current
  lessons (`LessonInfo`s, shown with their ids so the extractor may correct one); with `partner=`, an
  episode of the opposite result, the contrastive prompt (ExpeL-style): a won and a lost trajectory
  side by side, and the question what the won one did that the lost one did not. Trajectories are
  rendered by `distill.lessons.render`.
- `parse_items(text) -> list[str]`: the items of a structured answer, tolerant of thinking blocks,
  markdown, numbering, echoed placeholders and junk; `parse_free_text(text)` for the free-text style.
- `parse_operation(item) -> Operation`: an item is an addition, or an explicit correction of an existing
  lesson: "UPDATE #12: <new text>" or "DELETE #12" (see `distill.lessons.curate` for how they apply).
- `LessonExtractor(complete, *, style="structured", max_items=2, ...)`, where
  `complete(chats: list[list[dict]]) -> list[str]` is any batched chat completion (the runtime wraps
  the policy backend or a chat model in it); `extract(episodes, current_lessons, pool=0)` returns one
  `ExtractionOutcome` per episode: the screened items (see `distill.lessons.safety`), the rejections
  with reasons, the prompt and the raw answer. An answer with nothing parseable is an empty outcome,
  and it is still recorded.
- `record_extraction(store, outcome, run_id=...) -> RecordedExtraction`: writes the extraction and its
  proposed lessons in one transaction, each lesson with its provenance (source episode id, extraction
  id, pool); rejections and DELETE operations go into the extraction's metadata. Secrets are redacted
  from the stored prompt and answer.

Why this prompt: it follows the OPCD/OEL reference prompts in spirit (read the whole interaction and its
final outcome, infer the rules and why it was won or lost, append a few general items to the existing
experience, one `- EXPERIENCE ITEM:` per line; a free-text variant without the line format), in our own
words, plus two things the runtime needs: item ids, so that a wrong lesson can be corrected instead of
contradicted, and a length limit, because items enter every later prompt. The trajectory is cleaned of
chat-template control tokens before it is shown: environment text is untrusted. The contrastive variant
exists because a small extractor shown one trajectory tends to restate it vaguely; a pair isolates the
decisive difference (ExpeL compares successes with failures the same way).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from distill.lessons.render import ITEM_PREFIX, render_current, render_trajectory
from distill.lessons.safety import Rejection, mask_credentials, screen_items

if TYPE_CHECKING:
    from memory import EpisodeInfo, ExperienceStore, LessonInfo

Chat = list[dict[str, str]]
Complete = Callable[[list[Chat]], list[str]]
Style = Literal["structured", "free"]
STYLES = ("structured", "free")

_THINK_BLOCK = re.compile(r"<(think|thinking|reasoning)>.*?</\1>", re.IGNORECASE | re.DOTALL)
_THINK_OPEN = re.compile(r"<(?:think|thinking|reasoning)>", re.IGNORECASE)
_THINK_CLOSE = re.compile(r"</(?:think|thinking|reasoning)>", re.IGNORECASE)
_MARKER = re.compile(r"\bexperience[\s_-]*item\b(?:\s*#?\d+)?\s*\**\s*[:：]", re.IGNORECASE)
_LINE_LEAD = re.compile(r"^(?:[\s>*_`#•·-]|\d{1,3}[.)]\s|\(\d{1,3}\)\s)+")
_PLACEHOLDER = re.compile(
    r"^[\s.…<>\[\]()_-]*(?:\.\.\.|…|item|text|none|n/?a|nothing( new)?)?[\s.…<>\[\]()_-]*$", re.IGNORECASE
)
_BULLET = re.compile(r"^\s*(?:[-*•]|\d{1,3}[.)])\s+(.*\S)")
_OPERATION = re.compile(
    r"^(?P<op>update|replace|delete|remove)\s*(?:lesson|item)?\s*\[?#(?P<id>\d+)\]?\s*[:\-–]?\s*(?P<text>.*)$",
    re.IGNORECASE,
)


_INTRO = (
    "You keep a short list of experience: general lessons that help you do better in this kind of "
    "task. Below is one of your own past attempts, from the first observation to the final outcome, "
    "followed by the experience you had at the time.\n\n"
    "## The attempt\n{trajectory}\n\n"
    "## Your current experience\n# Experience\n{current}\n\n"
)
_INTRO_PAIR = (
    "You keep a short list of experience: general lessons that help you do better in this kind of "
    "task. Below are two of your own past attempts {where}, each from the first observation to the final "
    "outcome: attempt A was WON and attempt B was {lost}. They are followed by the experience you had at "
    "the time.\n\n"
    "## Attempt A (WON)\n{won_trajectory}\n\n"
    "## Attempt B ({lost})\n{lost_trajectory}\n\n"
    "## Your current experience\n# Experience\n{current}\n\n"
)
_STUDY = {
    ("structured", False): "Study the attempt closely. Compare what you did with how the environment reacted, "
    "work out the rules of the environment, and find the real reasons the attempt succeeded or failed.",
    ("free", False): "Study the attempt closely: infer the rules of the environment and the principles "
    "behind winning and losing.",
    ("structured", True): "Compare the two attempts closely, turn by turn. Find what the won attempt A did "
    "that the lost attempt B did not (or what B did that A avoided), and why that difference decided the "
    "outcome.",
    ("free", True): "Compare the two attempts closely: find what the won attempt A did that the lost "
    "attempt B did not, and the principle behind that difference.",
}
_STRUCTURED = (
    "## What to do\n"
    "{study} Then write "
    "at most {max_items} NEW experience item(s) that would help in future attempts at other tasks of "
    "this kind.\n\n"
    "Rules:\n"
    '- Each item is one line that starts with "{prefix}".\n'
    "- An item is a general rule, instruction or strategy in one sentence of at most {max_chars} "
    "characters. Do not mention details that only hold for this particular task (exact positions, "
    "names, numbers).\n"
    "- Do not repeat an item that is already in your experience.\n"
    '- If an existing item is wrong, correct it with "{prefix} UPDATE #<id>: <corrected item>" or '
    'remove it with "{prefix} DELETE #<id>".\n\n'
    "Reason briefly, then finish with:\n"
    "New experience:\n{prefix} ...\n"
)
_FREE = (
    "## What to do\n"
    "{study} Then write additional experience for future attempts at other tasks of this kind, to "
    "be appended to your current experience: at most {max_items} short, general point(s), without "
    "repeating what you already know.\n\n"
    "Reason briefly, then finish with:\n"
    "New experience:\n"
)
_NOT_WON = {"lost": "LOST", "truncated": "NOT FINISHED", "error": "FAILED WITH AN ERROR"}


def build_prompt(
    episode: EpisodeInfo,
    current: Sequence[LessonInfo | str] = (),
    *,
    style: Style = "structured",
    max_items: int = 2,
    max_item_chars: int = 300,
    max_step_chars: int = 600,
    max_trajectory_chars: int = 6000,
    partner: EpisodeInfo | None = None,
) -> Chat:
    """The extraction chat for one episode (a single user message, which every chat template accepts).

    With a `partner` of the opposite result (one won, the other not), the prompt is contrastive: both
    trajectories side by side, the won one first, each within half of `max_trajectory_chars` (so the
    prompt is no longer than a single-trajectory one), and the question is what the won one did that
    the lost one did not.
    """
    if style not in STYLES:
        raise ValueError(f"unknown extraction style {style!r}; known: {', '.join(STYLES)}")
    if partner is None:
        trajectory = render_trajectory(episode, max_step_chars=max_step_chars, max_chars=max_trajectory_chars)
        text = _INTRO.format(trajectory=trajectory, current=render_current(current))
    else:
        if episode.won == partner.won:
            raise ValueError(
                f"a contrastive prompt needs one won and one not won episode; episodes {episode.id} and "
                f"{partner.id} are both {'won' if episode.won else 'not won'}"
            )
        won, lost = (episode, partner) if episode.won else (partner, episode)
        half = max(max_trajectory_chars // 2, 400)
        text = _INTRO_PAIR.format(
            where="at the same task" if won.task_id == lost.task_id else "in the same environment",
            lost=_NOT_WON.get(lost.outcome, lost.outcome.upper()),
            won_trajectory=render_trajectory(won, max_step_chars=max_step_chars, max_chars=half),
            lost_trajectory=render_trajectory(lost, max_step_chars=max_step_chars, max_chars=half),
            current=render_current(current),
        )
    task = _STRUCTURED if style == "structured" else _FREE
    study = _STUDY[(style, partner is not None)]
    text += task.format(study=study, max_items=max_items, max_chars=max_item_chars, prefix=ITEM_PREFIX)
    return [{"role": "user", "content": text}]


# -- parsing -----------------------------------------------------------------------------------


def strip_thinking(text: str) -> str:
    """`text` without reasoning blocks; an unclosed block runs to the end, an unopened one from the start."""
    text = _THINK_BLOCK.sub("\n", text)
    close = list(_THINK_CLOSE.finditer(text))
    if close:
        text = text[close[-1].end() :]
    opened = _THINK_OPEN.search(text)
    if opened:
        text = text[: opened.start()]
    return text


def _tidy(item: str) -> str | None:
    item = re.sub(r"\*\*|__|`", "", item).strip().strip("\"'").strip()
    item = re.sub(r"^\[#\d+\]\s*", "", item)  # an id echoed from the current-experience listing
    item = re.sub(r"\s+", " ", item)
    if not item or _PLACEHOLDER.match(item):
        return None
    return item


def _dedupe(items: list[str]) -> list[str]:
    seen: set[str] = set()
    out = []
    for item in items:
        key = re.sub(r"\W+", " ", item.lower()).strip()
        if key and key not in seen:
            seen.add(key)
            out.append(item)
    return out


_MARKER_LINE_BREAK = re.compile(r"(EXPERIENCE ITEM:)[ \t]*\n\s*(?![-*•]?\s*\**\s*EXPERIENCE ITEM)", re.IGNORECASE)


def parse_items(text: str) -> list[str]:
    """The `- EXPERIENCE ITEM:` items of an answer, in order, without duplicates.

    Tolerates: thinking blocks (closed, unclosed or unopened), markdown bullets, bold and code marks,
    numbering ("1. ", "2) "), "Experience item 3:" variants, several items on one line, echoed
    placeholders ("- EXPERIENCE ITEM: ...") and any junk around them. No marker -> an empty list.
    """
    items: list[str] = []
    # small models often break the line after the marker: join the item's text back onto it
    text = _MARKER_LINE_BREAK.sub(r"\1 ", strip_thinking(text))
    for line in text.splitlines():
        markers = list(_MARKER.finditer(line))
        if not markers:
            continue
        before = line[: markers[0].start()]
        if _LINE_LEAD.sub("", before).strip() and not before.rstrip().endswith("-"):
            continue  # the marker sits inside prose ("the EXPERIENCE ITEM: format"), not an item
        for i, marker in enumerate(markers):
            end = markers[i + 1].start() if i + 1 < len(markers) else len(line)
            body = line[marker.end() : end].strip()
            body = re.sub(r"\s*[-*•]\s*$", "", body)  # the bullet of a following item on the same line
            tidy = _tidy(body)
            if tidy:
                items.append(tidy)
    return _dedupe(items)


def parse_free_text(text: str) -> list[str]:
    """Items of a free-text answer: marker lines if any, else the bullets (or paragraphs) after the
    last "New experience:" / "Additional experience" heading (or of the whole answer)."""
    marked = parse_items(text)
    if marked:
        return marked
    body = strip_thinking(text)
    heading = list(re.finditer(r"(?:new|additional)\s+experience[^\n:]*:?", body, re.IGNORECASE))
    if heading:
        body = body[heading[-1].end() :]
    bullets = [m.group(1) for m in map(_BULLET.match, body.splitlines()) if m]
    chunks = bullets or [p for p in re.split(r"\n\s*\n", body) if p.strip()]
    return _dedupe([t for t in (_tidy(_LINE_LEAD.sub("", c)) for c in chunks) if t])


@dataclass(frozen=True)
class Operation:
    """What an item asks for: "add" `text`, "update" lesson `target` to `text`, or "delete" `target`."""

    op: Literal["add", "update", "delete"]
    text: str
    target: int | None = None


def parse_operation(item: str) -> Operation:
    """Read an item as an addition, or an explicit "UPDATE #id: text" / "DELETE #id" correction."""
    match = _OPERATION.match(item.strip())
    if not match:
        return Operation("add", item)
    verb = match.group("op").lower()
    target = int(match.group("id"))
    rest = match.group("text").strip()
    if verb in ("delete", "remove"):
        return Operation("delete", rest, target)
    if not rest:
        return Operation("add", item)  # "UPDATE #3" without a new text is not a usable correction
    return Operation("update", rest, target)


# -- the extractor -----------------------------------------------------------------------------


@dataclass
class ExtractionOutcome:
    """The result of extracting from one episode (empty `items` when nothing parseable was written)."""

    episode_id: int
    env_id: str
    pool: int
    style: str
    extractor: str
    prompt: str
    raw: str
    items: list[str]
    rejected: list[Rejection] = field(default_factory=list)
    contrast: dict[str, Any] | None = None  # {"won": id, "lost": id, "same_task": bool} for a contrastive prompt

    @property
    def empty(self) -> bool:
        return not self.items

    @property
    def episode_ids(self) -> list[int]:
        """The episodes the extractor read: this one, and its contrasting partner if it had one."""
        if self.contrast is None:
            return [self.episode_id]
        partner = self.contrast["lost"] if self.contrast["won"] == self.episode_id else self.contrast["won"]
        return [self.episode_id, partner]


@dataclass(frozen=True)
class ExtractionRequest:
    """One extraction to run: an episode (with steps), the lessons shown with it, the pool, and (for a
    contrastive prompt) a partner episode with steps and the opposite result."""

    episode: EpisodeInfo
    current: Sequence[LessonInfo | str]
    pool: int = 0
    partner: EpisodeInfo | None = None


class LessonExtractor:
    """Extracts experience items from trajectories with any batched chat completion (see module doc)."""

    def __init__(
        self,
        complete: Complete,
        *,
        style: Style = "structured",
        max_items: int = 2,
        max_item_chars: int = 300,
        max_step_chars: int = 600,
        max_trajectory_chars: int = 6000,
        name: str = "policy",
    ) -> None:
        if style not in STYLES:
            raise ValueError(f"unknown extraction style {style!r}; known: {', '.join(STYLES)}")
        assert max_items >= 1, f"max_items must be at least 1, got {max_items}"
        self.complete = complete
        self.style: Style = style
        self.max_items = max_items
        self.max_item_chars = max_item_chars
        self.max_step_chars = max_step_chars
        self.max_trajectory_chars = max_trajectory_chars
        self.name = name

    @classmethod
    def from_settings(cls, complete: Complete, settings: Any, *, name: str | None = None) -> LessonExtractor:
        """An extractor configured by a `LessonsConfig`."""
        return cls(
            complete,
            style=settings.style,
            max_items=settings.max_items,
            max_item_chars=settings.max_item_chars,
            max_step_chars=settings.max_step_chars,
            max_trajectory_chars=settings.max_trajectory_chars,
            name=name or settings.extractor,
        )

    def prompt(
        self, episode: EpisodeInfo, current: Sequence[LessonInfo | str] = (), partner: EpisodeInfo | None = None
    ) -> Chat:
        return build_prompt(
            episode,
            current,
            style=self.style,
            max_items=self.max_items,
            max_item_chars=self.max_item_chars,
            max_step_chars=self.max_step_chars,
            max_trajectory_chars=self.max_trajectory_chars,
            partner=partner,
        )

    def parse(self, raw: str) -> tuple[list[str], list[Rejection]]:
        """Items of one answer after parsing and screening, at most `max_items`, plus rejections."""
        found = parse_items(raw) if self.style == "structured" else parse_free_text(raw)
        accepted, rejected = screen_items(found, self.max_item_chars)
        for extra in accepted[self.max_items :]:
            rejected.append(Rejection(mask_credentials(extra)[:200], f"over max_items={self.max_items}"))
        return accepted[: self.max_items], rejected

    def extract(
        self,
        episodes: Sequence[EpisodeInfo],
        current_lessons: Sequence[LessonInfo | str] = (),
        *,
        pool: int = 0,
    ) -> list[ExtractionOutcome]:
        """One outcome per episode, all extracted in one batch against the same current lessons."""
        return self.run([ExtractionRequest(e, current_lessons, pool) for e in episodes])

    def run(self, requests: Sequence[ExtractionRequest]) -> list[ExtractionOutcome]:
        """One batched completion call for all requests; one outcome per request, in order."""
        if not requests:
            return []
        for request in requests:
            for episode in (request.episode, request.partner):
                if episode is not None and episode.num_steps and not episode.steps:
                    raise ValueError(
                        f"episode {episode.id} was read without its steps; read it with "
                        "ExperienceStore.episode(id) (lists leave steps empty)"
                    )
        chats = [self.prompt(r.episode, r.current, r.partner) for r in requests]
        answers = self.complete(chats)
        if len(answers) != len(chats):
            raise ValueError(f"the completion function returned {len(answers)} answers for {len(chats)} chats")
        outcomes = []
        for request, chat, raw in zip(requests, chats, answers):
            items, rejected = self.parse(raw or "")
            outcomes.append(
                ExtractionOutcome(
                    episode_id=request.episode.id,
                    env_id=request.episode.env_id,
                    pool=request.pool,
                    style=self.style,
                    extractor=self.name,
                    prompt=chat[-1]["content"],
                    raw=raw or "",
                    items=items,
                    rejected=rejected,
                    contrast=_contrast(request.episode, request.partner),
                )
            )
        return outcomes


def _contrast(episode: EpisodeInfo, partner: EpisodeInfo | None) -> dict[str, Any] | None:
    if partner is None:
        return None
    won, lost = (episode, partner) if episode.won else (partner, episode)
    return {"won": won.id, "lost": lost.id, "same_task": won.task_id == lost.task_id}


# -- recording ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Proposal:
    """One recorded item, ready for curation: an addition/update (with its lesson row) or a deletion."""

    op: Literal["add", "update", "delete"]
    text: str
    pool: int
    extraction_id: int
    source_episode_ids: tuple[int, ...]
    lesson_id: int | None = None
    target: int | None = None


@dataclass(frozen=True)
class RecordedExtraction:
    extraction_id: int
    proposals: list[Proposal]


def record_extraction(
    store: ExperienceStore,
    outcome: ExtractionOutcome,
    *,
    run_id: int | None,
    count_tokens: Callable[[str], int] | None = None,
) -> RecordedExtraction:
    """Store the extraction and its proposed lessons (status "proposed") in one transaction.

    Each lesson carries its provenance: the source episode(s) -- both of a contrastive pair, whose roles
    are kept in the extraction's `metadata["contrast"]` --, this extraction, the pool, the env; an
    UPDATE also names its target in the lesson metadata. DELETEs and rejections are kept in the
    extraction's metadata. An empty outcome is recorded too (with `metadata["empty"] = True`).
    """
    operations = [parse_operation(item) for item in outcome.items]
    lessons: list[dict[str, Any]] = []
    for operation in operations:
        if operation.op == "delete":
            continue
        spec: dict[str, Any] = {"text": operation.text}
        if operation.op == "update":
            spec["metadata"] = {"op": "update", "target": operation.target}
        if count_tokens is not None:
            spec["token_count"] = count_tokens(operation.text)
        lessons.append(spec)
    metadata = {
        "style": outcome.style,
        "empty": outcome.empty,
        "items": list(outcome.items),
        "rejected": [{"text": r.text, "reason": r.reason} for r in outcome.rejected],
        "deletes": [o.target for o in operations if o.op == "delete"],
    }
    if outcome.contrast is not None:
        metadata["contrast"] = dict(outcome.contrast)
    extraction_id, lesson_ids = store.record_extraction(
        outcome.extractor,
        lessons,
        run_id=run_id,
        episode_ids=outcome.episode_ids,
        prompt=mask_credentials(outcome.prompt),
        response=mask_credentials(outcome.raw),
        env_id=outcome.env_id,
        pool=outcome.pool,
        metadata=metadata,
    )
    ids = iter(lesson_ids)
    sources = tuple(outcome.episode_ids)
    proposals = [
        Proposal(
            op=o.op,
            text=o.text,
            pool=outcome.pool,
            extraction_id=extraction_id,
            source_episode_ids=sources,
            lesson_id=None if o.op == "delete" else next(ids),
            target=o.target,
        )
        for o in operations
    ]
    return RecordedExtraction(extraction_id, proposals)
