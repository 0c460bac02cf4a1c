"""What `run --resume` may take from a stored config: the fields that name code (`code_references`) and those that
decide what runs, what is read or where the run writes (`RESUME_GUARDED`) must be the given config's; every other
difference is listed, and the stored run's value kept."""

from __future__ import annotations

import logging
import re
import sys
from pathlib import Path
from typing import Any

from agent_runtime.config.loading import config_from_dict
from agent_runtime.config.schema import ConfigError, RunConfig
from agent_runtime.llm.options import VLLM_SIZES
from agent_runtime.terminal import shown
from memory import ExperienceStore
from memory.redaction import REDACTED, is_secret_key, redact_secrets, restore_secrets

log = logging.getLogger("agent_runtime.run.loop")  # the loop's log: a resume is a step of the run


def code_references(config: RunConfig) -> dict[str, str]:
    """The fields of `config` that name Python code to import and call ('package.module:Name'), by dotted key.

    A stored config (a run's own, or one that came in with `memory import`) is data; `run --resume` refuses
    it when these differ from the config the user gave (`check_stored_code`), so resuming never runs code
    that only the database names. An interpreter to start (`model.options.python`, the vllm backend's engine in
    another environment) is code too: the stored one would be executed."""
    refs = {}
    if config.model.backend == "chat" and "class" in config.model.options:
        refs["model.options.class"] = str(config.model.options["class"])
    if config.model.options.get("python"):
        refs["model.options.python"] = str(config.model.options["python"])
    if config.lessons.extractor != "policy":
        refs["lessons.extractor"] = config.lessons.extractor
    if "class" in config.runtime.ray.server:
        refs["runtime.ray.server.class"] = str(config.runtime.ray.server["class"])
    for section, entries in (("envs", config.envs), ("opcd.retention_envs", config.opcd.retention_envs)):
        for i, entry in enumerate(entries):
            if ":" in entry.id:
                refs[f"{section}.{i}.id"] = entry.id
    return refs


def check_stored_code(stored: RunConfig, given: RunConfig, source: str) -> None:
    """Refuse a stored config that names code the given config does not (ConfigError listing each field)."""
    theirs, ours = code_references(stored), code_references(given)
    differ = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))
    if differ:
        lines = [f"  {k}: stored {theirs.get(k)!r}, given {ours.get(k)!r}" for k in differ]
        raise ConfigError(
            f"--resume: {source} names code that the given config does not; refusing to import "
            "and run it. Give a config that names the same classes, or start a new run:\n" + "\n".join(lines)
        )


# Fields that decide what runs, what is read or where anything is written: on --resume the stored run's value
# must be the given config's (`resume_differences`), besides the code references (`check_stored_code`). A
# pattern matches a dotted key and everything under it.
RESUME_GUARDED = (
    r"memory\.url",
    r"memory\.embedder",
    r"model\.name",
    r"model\.adapter",
    r"model\.options\.(.+\.)?(trust_remote_code|worker_extension_cls|logits_processors)",
    r"opcd\.context\.(file|prompts)",
    r"opcd\.teacher\.(model|adapter)",
    r"(envs|opcd\.retention_envs)\.\d+\.kwargs\.cache_dir",
)
_GUARDED = re.compile(rf"^({'|'.join(RESUME_GUARDED)})(\..*)?$")
# what a resumed run takes from the config given now; every other field is the stored run's
RESUME_TAKES = ("runtime.episodes", "runtime.hours")


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    """A config dump as {dotted key: leaf value}; an empty section or list is a leaf of its own."""
    if isinstance(data, dict) and data:
        items = data.items()
    elif isinstance(data, list) and data:
        items = ((str(i), v) for i, v in enumerate(data))
    else:
        return {prefix: data}
    out: dict[str, Any] = {}
    for key, value in items:
        out.update(_flat(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def _engine_options(config: RunConfig) -> set[str]:
    """The `model.options` keys of a vllm config that start its engine (by dotted key): every engine argument (vLLM
    imports some by name, others name files), the interpreter and its log; not the backend's own sizes."""
    if config.model.backend != "vllm":
        return set()
    return {f"model.options.{key}" for key in config.model.options if key not in VLLM_SIZES}


def resume_differences(stored: RunConfig, given: RunConfig, source: str) -> list[str]:
    """On --resume, every field where the stored run's config and the given one differ, one line each; a
    ConfigError (listing them all) when one of them decides what runs, what is read or where anything is
    written (`RESUME_GUARDED`, a vllm engine's options: `_engine_options`, and the code references:
    `check_stored_code`)."""
    check_stored_code(stored, given, source)
    theirs, ours = _flat(stored.model_dump(mode="json")), _flat(given.model_dump(mode="json"))
    missing = object()
    differ = sorted(k for k in set(theirs) | set(ours) if theirs.get(k, missing) != ours.get(k, missing))
    engine = _engine_options(stored) | _engine_options(given)
    guarded = [k for k in differ if _GUARDED.match(k) or ".".join(k.split(".")[:3]) in engine]

    def shown(key: str, value: Any) -> Any:  # the lines reach a terminal and a log: no secret in them
        secret = is_secret_key(key.rsplit(".", 1)[-1]) and value not in (None, "")
        return REDACTED if secret else redact_secrets(value)

    def line(key: str) -> str:
        return f"  {key}: stored {shown(key, theirs.get(key))!r}, given {shown(key, ours.get(key))!r}"

    if guarded:
        raise ConfigError(
            f"--resume: the given config and {source} differ in fields that decide what runs, what is read or "
            "where the run writes; refusing to resume with either. Give a config with the stored values, or start "
            "a new run (another name, or without --resume):\n" + "\n".join(line(k) for k in guarded)
        )
    return [line(k) + ("" if k.startswith(RESUME_TAKES) else " (the stored value is kept)") for k in differ]


def stored_config(config: RunConfig, workdir: Path) -> tuple[RunConfig, int]:
    """On --resume the run's own config wins; only the stop conditions may change. The given config is the
    authority on what may be resumed: a field where the two differ is listed, and one that decides what runs,
    what is read or where the run writes refuses the resume (`resume_differences`). Returns the config and
    the id of the run to continue."""
    with ExperienceStore.open(config.memory.url or workdir) as store:
        existing = store.find_run(config.name)
        url = store.url
        if existing is None:
            raise ConfigError(f"--resume: no run named {config.name!r} in {url}; start one without --resume")
    # the store keeps no secrets: a resumed run takes them from the config given now
    data = restore_secrets(existing.config, config.model_dump(mode="json"))
    stored = config_from_dict(data, source=f"run {existing.id}", stored=True)
    if stored.name != existing.name:
        raise ConfigError(
            f"--resume: run {existing.id} in {url} is named {existing.name!r}, but its stored config names the "
            f"run {stored.name!r}: the store disagrees with itself (an edited or imported store?), so which run "
            f"to continue is unclear; refusing to resume it. Start a new run instead (without --resume, or "
            f"--set name=ANOTHER), or give the store a run whose name and stored config agree"
        )
    differences = resume_differences(stored, config, f"the stored config of run {existing.id}")
    if differences:
        head = (
            f"--resume: run {existing.id} ({existing.name}): the given config differs from the stored one "
            "(only runtime.episodes and runtime.hours are taken from the given config):"
        )
        log.warning(head + "\n" + "\n".join(differences))
        print(head, *differences, sep="\n", file=sys.stderr)
    for line in stored.lessons.held_out_decisions + stored.opcd.held_out_decisions:  # old defaults: flagged
        flag = f"--resume: run {existing.id}: {line}, the held-out games its tables report (not clean)"
        log.warning(flag)
        print(shown(flag), file=sys.stderr)
    stored.runtime.episodes = config.runtime.episodes
    stored.runtime.hours = config.runtime.hours
    return stored, existing.id
