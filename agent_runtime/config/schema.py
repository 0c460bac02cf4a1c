"""Run configuration, the schema: pydantic models validated from YAML, overridable from the command line.

One `RunConfig` describes a whole run: the policy model, the environments and their mixing weights, the
agent's prompt, the runtime (slots, stop conditions) and the schedule of the later phases. Unknown keys are
errors (a typo must not silently fall back to a default), and every error names the file, the dotted key and
what is accepted. `--set a.b=c` overrides any field; values are parsed as YAML scalars, so `--set
runtime.slots=4` gives an int and `--set model.name=foo` a string. The resolved config is written into the
workdir with every run, so a run can always be reproduced from its own directory.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationInfo, field_validator, model_validator

from agent_runtime.curriculum import CurriculumConfig
from agent_runtime.llm.options import backend_options
from distill.lessons.config import DECISION_SPLITS, LessonsConfig, decision_split
from distill.opcd.config import OPCDConfig
from distill.opcd.teacher import TeacherSpec
from modelkit.config_base import StrictConfig


class ConfigError(ValueError):
    """A configuration file or override is wrong; the message says where and what is accepted."""


class ModelConfig(StrictConfig):
    """The acting policy. `options` is checked against the backend's own model (`agent_runtime.llm.options`) when
    the config is read, and `typed_options()` gives it typed."""

    name: str = Field("smollm2-135m-instruct", description="alias, Hugging Face id, or local path")
    backend: Literal["transformers", "vllm", "chat", "scripted"] = "transformers"
    device: str = Field("cpu", description="cpu, cuda, cuda:N, or auto")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    max_new_tokens: int = Field(32, gt=0)
    temperature: float = Field(0.7, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    context_window: int | None = Field(None, gt=0, description="prompt budget in tokens; default: the model's")
    adapter: str | None = Field(None, description="a LoRA adapter directory to load at start")
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="backend-specific options: see agent_runtime/llm/options.py",
    )

    @field_validator("options")
    @classmethod
    def _options_fit_the_backend(cls, options: dict[str, Any], info) -> dict[str, Any]:
        if "backend" in info.data:  # else the backend's own error is the one to read
            backend_options(info.data["backend"], options)
        return options

    def typed_options(self) -> BaseModel:
        """`options` as the backend's option model (`agent_runtime.llm.options.BACKEND_OPTIONS`)."""
        return backend_options(self.backend, self.options)


class EnvEntry(StrictConfig):
    """One environment of the run's mixture."""

    id: str
    weight: float = Field(1.0, gt=0.0)
    max_steps: int | None = Field(None, gt=0)
    kwargs: dict[str, Any] = Field(default_factory=dict)


class AgentConfig(StrictConfig):
    """Prompt assembly."""

    system_prompt: str | None = Field(None, description="default: a prompt per environment family")
    action_mode: Literal["auto", "choice", "free"] = Field(
        "auto",
        description="choice: the reply is one admissible action (or arena move) drawn from the model's "
        "distribution restricted to that set; free: the model writes a reply and the action is parsed from it; "
        "auto: choice wherever the game lists actions or has fixed moves, free for math",
    )
    show_admissible_actions: bool = True
    history_shows_admissible: bool = Field(
        True,
        description="past turns keep the action list they were shown with, so the transcript is "
        "append-only and a KV cache (the transformers backend's per-slot cache, vLLM's prefix caching) reuses it "
        "whole; false shows past observations without their lists (shorter prompts, every turn re-prefilled "
        "from the previous observation on)",
    )
    max_history_turns: int = Field(8, ge=0)
    retrieved_examples: int = Field(0, ge=0, description="past won episodes of the same env shown as examples")
    explore: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="PLAY only: the share of choice-mode decisions drawn uniformly from the admissible actions instead "
        "of the policy (seeded per draw and turn; marked `explored` on the step). A policy that almost never wins "
        "gives lessons induced from evidence nothing to contrast; evaluation, the gate and trials never explore",
    )


class RayConfig(StrictConfig):
    """Rollout workers on a Ray cluster (`runtime.executor: ray`); see agent_runtime/run/ray_executor.py."""

    workers: int = Field(2, gt=0, description="rollout workers (Ray actors), each with its own env slots")
    slots: int | None = Field(None, gt=0, description="env slots per worker; default: runtime.slots")
    address: str | None = Field(None, description="cluster to join ('auto', 'ray://host:10001'); None: start one here")
    generation: Literal["local", "server"] = Field(
        "local", description="local: each worker builds `model`; server: workers use the chat backend on `server`"
    )
    server: dict[str, Any] = Field(
        default_factory=dict, description="chat backend options (class, kwargs, ...) of the shared server"
    )
    worker_cpus: float = Field(1.0, ge=0)
    worker_gpus: float = Field(0.0, ge=0)
    replace_workers: int = Field(
        2,
        ge=0,
        description="dead rollout workers replaced by fresh ones (per driver process); 0: go on with "
        "the workers that are left",
    )
    learner: Literal["worker", "driver"] = Field(
        "worker",
        description="where EXTRACT and CONSOLIDATE run: a designated Ray actor (the learner, with "
        "learner_gpus GPUs) or the driver process",
    )
    learner_cpus: float = Field(1.0, ge=0)
    learner_gpus: float | None = Field(
        None,
        ge=0,
        description="GPUs of the learner; with more than one, OPCD trains data parallel over them (one "
        "rank per GPU). Default: one GPU when the cluster has one the rollout workers do not claim, else none",
    )
    learner_device: str = Field("auto", description="the learner's model device (auto: cuda when it has a GPU)")

    @model_validator(mode="after")
    def _server_needs_options(self) -> RayConfig:
        if self.generation == "server" and not self.server:
            raise ValueError(
                "generation: server needs `server:` chat backend options, e.g. "
                "{class: langchain_openai:ChatOpenAI, kwargs: {base_url: http://vllm:8000/v1, model: m}}"
            )
        if self.server:
            backend_options("chat", self.server)  # the same options as model.options of the chat backend
        return self


class RuntimeConfig(StrictConfig):
    """How episodes are run and when the run stops."""

    slots: int = Field(1, gt=0, description="environments stepped together, one batched generate per turn")
    episodes: int | None = Field(None, gt=0, description="stop after this many episodes (None: never)")
    hours: float | None = Field(None, gt=0)
    summary_every: int = Field(10, gt=0)
    executor: Literal["local", "ray"] = "local"
    ray: RayConfig = Field(default_factory=RayConfig)


class CycleTrainerConfig(OPCDConfig):
    """The OPCD trainer as a loop's cycle runs it (`opcd.trainer`): a LoRA adapter trained between episodes.

    These defaults are the only ones this section has, so a partial override (`--set opcd.trainer.steps=50`)
    changes that field and nothing else. They differ from `OPCDConfig`'s paper defaults where a cycle inside
    a running loop needs it: a short budget, one game turn per sample (32 new tokens), and a learning rate for
    a rank-8 LoRA (the paper's 1e-6..5e-6 moves a LoRA of this size too little in a cycle's budget). How the
    steps and batch were chosen, and what other budgets kept of the gain: bench/RESULTS.md, "One consolidation
    cycle, 10 seeds" (`bench/cycle_sweep.py`); the validation split stays available (`validation_fraction`)."""

    lr: float = Field(1e-4, gt=0, description="AdamW learning rate")
    max_new_tokens: int = Field(32, ge=1, description="longest sampled response: one turn of a game")
    steps: int = Field(8, ge=0, description="optimizer steps of a cycle")
    lora_r: int = Field(8, ge=1)


class SystemPromptConfig(StrictConfig):
    """System-prompt distillation (`opcd.context`, the paper's medical and safety set-ups): every cycle distils
    this one fixed text, appended to the system message of the teacher's prompts, into an adapter, instead of
    the run's lessons. Exactly one of `text` and `file`."""

    text: str | None = Field(None, description="the system prompt itself")
    file: str | None = Field(None, description="a UTF-8 text file holding it (read when a cycle starts)")
    prompts: str | None = Field(
        None,
        description='a JSONL file of training prompts, one per line ({"messages": [...]} or {"prompt": '
        '"..."}); default: the per-turn prompts of the run\'s recent episodes',
    )

    @model_validator(mode="after")
    def _one_source(self) -> SystemPromptConfig:
        if (self.text is None) == (self.file is None):
            raise ValueError("give exactly one of `text` (the system prompt) and `file` (a file holding it)")
        if self.text is not None and not self.text.strip():
            raise ValueError("`text` is empty; give the system prompt to distil")
        return self


class ConsolidationConfig(StrictConfig):
    """The CONSOLIDATE / EVALUATE / PROMOTE phases (the `opcd:` section); see agent_runtime/phases/consolidate.py."""

    enabled: bool = False
    consolidate_every: int = Field(32, gt=0, description="episodes between two cycles")
    recent_episodes: int = Field(
        32,
        gt=0,
        description="episodes whose per-turn prefixes are the prompts: the newest of each environment the run is "
        "playing now (those among its newest `recent_episodes` episodes)",
    )
    max_prompts: int = Field(256, gt=0, description="at most this many prompts per cycle")
    trainer: CycleTrainerConfig = Field(default_factory=CycleTrainerConfig)
    eval_episodes: int | None = Field(None, gt=0, description="held-out tasks per env (default: evaluation's)")
    retention_envs: list[EnvEntry] = Field(
        default_factory=list, description="out-of-distribution envs for the retention check (like `envs`)"
    )
    anchor_envs: list[EnvEntry] = Field(
        default_factory=list,
        description="envs whose states the student keeps (replay against forgetting): before "
        "the cycle trains, the parent plays anchor_episodes of each one's train tasks greedily without lessons, and "
        "the cycle holds the student's policy there to the parent's. Never a retention env (the check would then be "
        "trained on)",
    )
    anchor_episodes: int = Field(16, gt=0, description="train tasks per anchor env played for the anchor prompts")
    replay_episodes: int = Field(
        8,
        ge=0,
        description="for each environment the run has played that the recent episodes leave out, its newest episodes "
        "from the memory join the cycle: taught with that environment's lessons, or, where none is in scope, "
        "replayed (the student held to its parent on the run's own past decisions); 0: none",
    )
    promote_margin: float = Field(0.05, ge=0, le=1, description="allowed drop of the student without lessons")
    retention_margin: float = Field(0.05, ge=0, le=1, description="allowed drop on the retention set")
    regression_games: int = Field(
        2,
        ge=1,
        description="a drop on an environment's validation games is a regression only when it is over the margin "
        "and at least this many games net (the parent's wins minus the student's, on the same games and seeds): "
        "one game of 8 is 12.5 points, over any margin, and no evidence of forgetting; 1: any drop over the margin",
    )
    recheck_games: int = Field(
        8,
        ge=0,
        description="a drop on an environment's validation games over the margin but of fewer than regression_games "
        "games is looked at again: the parent and the student play this many more validation games of that environment "
        "(the next tasks, fixed seeds, every validation condition) and the check is made on all of them; "
        "0: such a drop is let through at once",
    )
    internalized_ratio: float = Field(0.5, gt=0, le=1, description="per-lesson KL after/before for consolidation")
    min_kl_drop: float = Field(
        0.1,
        ge=0,
        le=1,
        description="evidence of learning: the held-out KL to the teacher fell by at least this "
        "fraction of its start-of-cycle value (0: any cycle that did not raise it)",
    )
    validation_games: int = Field(
        20,
        ge=0,
        description="games of validation_split (the first N, fixed seeds, greedy) that the parent and the student "
        "play, without and with the lessons: the student winning more of them than the parent by over "
        "promote_margin is evidence of learning too, and every no-regression check is made on them, never on the "
        "held-out games of the report. 20 games see a drop of 14 points 4 times in 5 (distill.evidence)",
    )
    validation_split: str = Field(
        "validation",
        description="the fold the promotion's games come from: validation (games generated apart from the train and "
        "the held-out ones), or train for an environment that has no validation fold; never eval",
    )
    teacher: TeacherSpec | None = Field(
        None, description="a separate teacher model (cross-size distillation); default: the start-of-cycle policy"
    )
    context: SystemPromptConfig | None = Field(
        None, description="distil this fixed system prompt instead of the lessons (system-prompt distillation)"
    )

    @model_validator(mode="after")
    def _anchors(self) -> ConsolidationConfig:
        if self.anchor_envs and self.teacher is not None:
            raise ValueError(
                "opcd.anchor_envs hold the student to the start-of-cycle policy, and opcd.teacher names "
                "a separate teacher: use one of them"
            )
        checked = [(e.id, e.kwargs) for e in self.retention_envs]
        for entry in self.anchor_envs:
            if (entry.id, entry.kwargs) in checked:
                raise ValueError(
                    f"opcd.anchor_envs: {entry.id} {entry.kwargs} is also a retention env; the retention "
                    "check must be made on an env the cycle did not train on: anchor another one"
                )
        return self

    @field_validator("validation_split")
    @classmethod
    def _promotion_plays_no_held_out_games(cls, split: str, info: ValidationInfo) -> str:
        return decision_split(split, info, "the promotion decides which adapter acts")

    @field_validator("validation_games")
    @classmethod
    def _promotion_has_games(cls, games: int, info: ValidationInfo) -> int:
        if games == 0 and not (info.context or {}).get("stored"):
            raise ValueError(
                "validation_games 0: without validation games the promotion would judge regressions on the held-out "
                "games the tables report; give at least 1 (20 see a drop of 14 points 4 times in 5)"
            )
        return games

    @property
    def held_out_decisions(self) -> list[str]:
        """The settings under which the promotion reads held-out games (a stored run's config made before the
        validation fold), one line each; empty for a config read now."""
        out = []
        if self.validation_split not in DECISION_SPLITS:
            out.append(f"opcd.validation_split is {self.validation_split!r}: the promotion read games of that split")
        if self.validation_games == 0:
            out.append("opcd.validation_games is 0: the promotion judged regressions on the held-out games")
        return out

    @model_validator(mode="after")
    def _teacher_device(self) -> ConsolidationConfig:
        if self.teacher is not None and self.teacher.device and self.trainer.processes > 1:
            raise ValueError(
                f"opcd.teacher.device: {self.teacher.device} with opcd.trainer.processes: "
                f"{self.trainer.processes}; each data-parallel rank holds its own teacher on its own "
                "device, so leave opcd.teacher.device unset"
            )
        return self


class EvaluationConfig(StrictConfig):
    """Held-out evaluation (`agent-runtime eval`, and the EVALUATE phase)."""

    episodes_per_env: int = Field(20, gt=0, description="eval-split tasks per environment, always the first N")
    temperature: float = Field(0.0, ge=0.0, description="0 = greedy, so that two policies are compared fairly")
    seed: int = 1234


class MemoryConfig(StrictConfig):
    url: str | None = Field(None, description="SQLAlchemy URL; default: SQLite memory.db in the workdir")
    embedder: str | None = Field(None, description="minilm (default), hash, hash:DIM, or a model directory")


class RunConfig(StrictConfig):
    # a folder name under runs/ and a label: no path separator, and no leading dot (`.`, `..` or a hidden name)
    name: str = Field(..., pattern=r"^[A-Za-z0-9_-][A-Za-z0-9_.-]*$")
    seed: int = 0
    model: ModelConfig = Field(default_factory=ModelConfig)
    envs: list[EnvEntry] = Field(..., min_length=1)
    agent: AgentConfig = Field(default_factory=AgentConfig)
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    lessons: LessonsConfig = Field(default_factory=LessonsConfig)
    opcd: ConsolidationConfig = Field(default_factory=ConsolidationConfig)
    evaluation: EvaluationConfig = Field(default_factory=EvaluationConfig)
    memory: MemoryConfig = Field(default_factory=MemoryConfig)
    curriculum: CurriculumConfig | None = Field(None, description="environments arriving over time, in phases")

    @field_validator("envs")
    @classmethod
    def _unique_env_ids(cls, envs: list[EnvEntry]) -> list[EnvEntry]:
        ids = [e.id for e in envs]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"environment listed twice: {', '.join(dupes)}")
        return envs

    @model_validator(mode="after")
    def _curriculum_of_known_envs(self) -> RunConfig:
        if self.curriculum is None:
            return self
        ids = [e.id for e in self.envs]
        unknown = self.curriculum.unknown(ids)
        if unknown:
            raise ValueError(
                f"curriculum.phases name environments the run does not list in envs: {', '.join(unknown)}; "
                f"envs: {', '.join(ids)}"
            )
        total = self.curriculum.episodes
        if self.runtime.episodes is not None and self.runtime.episodes != total:
            raise ValueError(
                f"runtime.episodes is {self.runtime.episodes} but the curriculum's phases add up to {total}: "
                "leave runtime.episodes out (the phases decide it) or make them agree"
            )
        self.runtime.episodes = total
        return self
