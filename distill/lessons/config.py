"""`LessonsConfig`: every knob of lesson extraction, curation and the validation gate, in one model.

What: a strict pydantic model (unknown keys are errors, assignments are validated) that the run config
embeds as its `lessons:` section. Defaults suit the quickstart (a 135M model with a short context: a
256-token lesson budget); the paper's settings are `budget_tokens: 8192` for games and `16384` for
math, with `pools: 10`.

`seed` is a list of lessons a person wrote (see `distill.lessons.user_lessons`); the integer that seeds each pool's
episode order is `pool_seed` (an integer `seed`, its old name, is still read as `pool_seed`).

A decision plays games of a split in `DECISION_SPLITS`, never the held-out eval split whose games `eval`, the cycle's
table and the continual matrix report: a lesson chosen on the games it is then measured on would be measured with a
bias. Two folds serve them, as in any careful study: the trials that search among induced lessons play the train
fold (`trial_split`), where the agent also plays and learns; the gate's go-live decision, for a person's lessons and
for the set the search chose, plays the validation fold (`gate_split`), games generated apart from both, so that the
decision is not fitted to the noise of the search that proposed it. A config asking for another split is refused when it is read, except
a config a run already holds (`stored=True` in the validation context: a stored run's, made when the gate's default
was `eval`), which loads as it was made and is flagged by `held_out_decisions`.

Why one model: the extractor, the curator and the gate read their knobs from it, the run stores it
resolved with every run, and a typo in a YAML file fails loudly instead of silently using a default.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from distill.lessons.safety import screen_item
from modelkit.config_base import StrictConfig

# The task splits a decision may play; the held-out `eval` split is the report's and never one of them.
DECISION_SPLITS = ("validation", "train")


def decision_split(split: str, info: ValidationInfo, decides: str) -> str:
    """`split` if a decision (one that `decides` what) may play it: one of `DECISION_SPLITS`, or anything in a config
    a run already holds (`stored` in the validation context: loaded as it was made, flagged by the caller)."""
    if split not in DECISION_SPLITS and not (info.context or {}).get("stored"):
        raise ValueError(
            f"{info.field_name} {split!r}: {decides}, and the games it plays must not be the held-out ones that eval, "
            f"the cycle's table and the continual matrix report; accepted: {', '.join(DECISION_SPLITS)}"
        )
    return split


class LessonsConfig(StrictConfig):
    """Lesson extraction (EXTRACT phase), curation under a budget, and the validation gate."""

    enabled: bool = Field(False, description="run the EXTRACT phase at all")
    extract_every: int = Field(8, gt=0, description="episodes between two EXTRACT phases")
    recent_episodes: int | None = Field(
        None, gt=0, description="episodes read per EXTRACT phase (default: extract_every, the new ones)"
    )
    extractor: str = Field(
        "policy", description="'policy' (the acting model itself) or a chat-model spec for the runtime"
    )
    method: Literal["model", "evidence", "both"] = Field(
        "model",
        description="how lessons are found: the extractor model writes them ('model'), they are induced from what "
        "separates won from lost episodes and each is tried before it goes live ('evidence'), or both",
    )
    induce_candidates: int = Field(
        4, ge=1, le=20, description="'evidence': induced lessons tried per EXTRACT and environment, best evidence first"
    )
    induce_min_support: int = Field(
        2, ge=1, description="'evidence': times an action must have been chosen on the side a finding is about"
    )
    induce_min_gap: float = Field(
        0.3, gt=0.0, le=1.0, description="'evidence': difference between the won and lost episodes' choice rates"
    )
    induce_min_gain: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="'evidence': a tried lesson goes live only if it raises success on the gate's games by more "
        "than this (paired, against the lessons live before it)",
    )
    style: Literal["structured", "free"] = Field(
        "structured", description="extraction prompt: '- EXPERIENCE ITEM:' lines, or free text"
    )
    max_items: int = Field(2, ge=1, le=10, description="items kept per extraction (the paper: 1-2)")
    max_item_chars: int = Field(300, ge=20, description="longer items are cut at a word boundary")
    temperature: float = Field(0.7, ge=0.0, description="extractor sampling temperature (paper: 0.7)")
    max_new_tokens: int = Field(384, gt=0, description="extractor response budget")
    prefill: bool = Field(
        True, description="start a local extractor's answer with '- EXPERIENCE ITEM:' (small models need it)"
    )
    max_step_chars: int = Field(600, gt=0, description="per-turn cap when a trajectory is rendered")
    max_trajectory_chars: int = Field(
        6000, gt=0, description="cap on the rendered trajectory (middle turns are elided)"
    )
    extract_batch: int = Field(
        1, ge=1, description="episodes per pool extracted against the same lessons (1: strictly sequential)"
    )
    budget_tokens: int = Field(
        256,
        ge=0,
        description="tokens of the rendered lesson block per pool and scope (paper: 8192 games, 16384 math); an "
        "episode whose environment has more lessons in scope gets the most relevant that fit",
    )
    context_lessons: int = Field(
        0,
        ge=0,
        description="at most this many lessons in an episode's prompt, the most relevant to its goal and first "
        "observation (0: as many as fit budget_tokens)",
    )
    pools: int = Field(1, ge=1, description="independent lesson pools (paper: 10); one is drawn per prompt")
    pool_seed: int = Field(
        1, description="pool p visits an EXTRACT phase's episodes in an order seeded by pool_seed + p"
    )
    seed: list[str] = Field(
        default_factory=list,
        description="lessons written by a person, added to every pool when a new run starts (as `lessons add`)",
    )
    contrastive: bool = Field(
        False, description="show the extractor a won and a lost trajectory of the same environment side by side"
    )
    contrastive_lookback: int = Field(
        200, ge=0, description="older episodes of the run searched for a contrasting partner (0: only those read)"
    )
    embedder: str | None = Field(None, description="embedder spec for similarity; None: the store's")
    merge_threshold: float = Field(
        0.9, gt=0.0, le=1.0, description="cosine at or above which a new item merges into an existing one"
    )
    conflict_threshold: float = Field(
        0.75, gt=0.0, le=1.0, description="cosine at or above which opposite polarity means a conflict"
    )
    utility_min_episodes: int = Field(
        3, ge=1, description="episodes with a lesson in context before its measured utility counts"
    )
    gate_episodes: int = Field(
        8, ge=0, description="games of gate_split per lesson set for the gate (0: promote without a gate)"
    )
    gate_split: str = Field(
        "validation",
        description="the task split the gate's go-live decision plays (a person's lessons, the set the trials of "
        f"induced lessons chose); one of {', '.join(DECISION_SPLITS)} (never the held-out eval split, whose games "
        "the tables report)",
    )
    trial_split: str = Field(
        "train",
        description="the task split the trials that search among induced lessons play; one of "
        f"{', '.join(DECISION_SPLITS)}",
    )
    gate_margin: float = Field(
        0.05, ge=0.0, le=1.0, description="block a candidate whose success rate is lower by more than this"
    )

    @model_validator(mode="before")
    @classmethod
    def _int_seed_is_the_pool_seed(cls, data: Any) -> Any:
        """Kept so that stored runs and old configs load: an int `seed` is the old spelling of `pool_seed`."""
        if isinstance(data, dict) and isinstance(data.get("seed"), int) and not isinstance(data["seed"], bool):
            if "pool_seed" in data and data["pool_seed"] != data["seed"]:
                raise ValueError(
                    f"seed: {data['seed']} is the old name of pool_seed, which is also given ({data['pool_seed']}); "
                    "keep pool_seed, and give seed as a list of lesson texts"
                )
            data = {k: v for k, v in data.items() if k != "seed"} | {"pool_seed": data["seed"]}
        return data

    @field_validator("gate_split", "trial_split")
    @classmethod
    def _decisions_play_no_held_out_games(cls, split: str, info: ValidationInfo) -> str:
        return decision_split(split, info, "the gate decides which lessons go live")

    @property
    def held_out_decisions(self) -> list[str]:
        """The settings under which a decision plays a split other than `DECISION_SPLITS` (a stored run's config made
        when the gate's default was `eval`), one line each; empty for a config read now."""
        return [
            f"lessons.{name} is {split!r}: the gate chose lessons on games of that split"
            for name, split in (("gate_split", self.gate_split), ("trial_split", self.trial_split))
            if split not in DECISION_SPLITS
        ]

    @model_validator(mode="after")
    def _seed_lessons_pass_the_screen(self) -> LessonsConfig:
        for i, text in enumerate(self.seed):
            verdict = screen_item(text, self.max_item_chars)
            if not verdict.accepted:
                raise ValueError(
                    f"seed[{i}] ({text[:60]!r}) is rejected by the lesson safety screen: {verdict.reason}; "
                    "write it as one general rule of at least two words, without instructions to the model "
                    "about its prompt and without secrets"
                )
        return self

    @model_validator(mode="after")
    def _thresholds(self) -> LessonsConfig:
        if self.conflict_threshold > self.merge_threshold:
            raise ValueError(
                f"conflict_threshold ({self.conflict_threshold}) must not exceed merge_threshold "
                f"({self.merge_threshold}): a near-duplicate is merged before a conflict is considered"
            )
        return self

    @model_validator(mode="after")
    def _induced_lessons_are_tried(self) -> LessonsConfig:
        if self.method != "model" and self.gate_episodes == 0:
            raise ValueError(
                f"method: {self.method} tries each induced lesson on the gate's games before it goes live, and "
                "gate_episodes is 0; set gate_episodes > 0 (e.g. 12), or use method: model"
            )
        return self

    @property
    def gated(self) -> bool:
        """Whether a new lesson set waits as a candidate for the gate (`distill.lessons.golive`) before it goes live."""
        return self.gate_episodes > 0

    @property
    def user_lessons_gated(self) -> bool:
        """Whether a person's lessons wait for the gate (a candidate the loop gates before it next plays) rather than
        go live at once: only while lessons are learned at all, as the gate is an EXTRACT-time decision."""
        return self.enabled and self.gated

    @property
    def confirms_on_gate_split(self) -> bool:
        """Whether the set the induced lessons' search chose is confirmed on the gate's games before it goes live;
        when both folds are the same, the search's own games decide (`distill.lessons.selection`)."""
        return self.gate_split != self.trial_split

    @property
    def episodes_per_extraction(self) -> int:
        """How many recent episodes one EXTRACT phase reads."""
        return self.recent_episodes or self.extract_every
