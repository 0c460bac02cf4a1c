"""Reading a config: YAML (bounded: `agent_runtime.bounded_yaml`) or a dict validated into a `RunConfig`, `--set
a.b=c` overrides, and errors that name the file, the dotted key and what is accepted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from agent_runtime.bounded_yaml import YAMLLimitError, load_yaml
from agent_runtime.config.schema import ConfigError, RunConfig


def _accepted_keys(model: type[BaseModel], loc: tuple) -> list[str]:
    """The field names accepted at a dotted location, for error messages."""
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        if field is None:
            return []
        ann = field.annotation
        inner = getattr(ann, "__args__", None)
        candidates = [ann, *(inner or ())]
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if model is None:
            return []
    return sorted(model.model_fields)


def _format_errors(err: ValidationError, source: str) -> str:
    lines = []
    for e in err.errors():
        loc = tuple(e["loc"])
        key = ".".join(str(p) for p in loc) or "(top level)"
        if e["type"] == "extra_forbidden":
            accepted = _accepted_keys(RunConfig, loc)
            lines.append(f"{source}: {key}: unknown key; accepted: {', '.join(accepted)}")
        else:
            got = e.get("input")
            got_s = "" if isinstance(got, dict) else f" (got {got!r})"
            msg = e["msg"].removeprefix("Value error, ")
            lines.append(f"{source}: {key}: {msg}{got_s}")
    return "\n".join(lines)


def _set_dotted(data: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node: Any = data
    for part in parts[:-1]:
        if isinstance(node, list):
            node = node[int(part)]
        else:
            node = node.setdefault(part, {})
            if not isinstance(node, (dict, list)):
                raise ConfigError(f"--set {dotted}: {part} is not a section")
    last = parts[-1]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply `a.b=c` overrides in place; values are YAML scalars (or YAML flow lists/maps)."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. --set runtime.slots=4")
        key, raw = item.split("=", 1)
        try:
            value = load_yaml(raw) if raw != "" else ""
        except YAMLLimitError as exc:
            raise ConfigError(f"--set {key}: {exc}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"--set {key}: value {raw!r} is not valid YAML: {exc}") from None
        try:
            _set_dotted(data, key.strip(), value)
        except (IndexError, ValueError) as exc:
            raise ConfigError(f"--set {key}: no such list element ({exc})") from None
    return data


def load_config(path: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """Read a YAML config, apply `--set` overrides, validate. Raises ConfigError with every problem listed."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = load_yaml(path.read_text()) or {}
    except YAMLLimitError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    data.setdefault("name", path.stem)
    apply_overrides(data, overrides or [])
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_errors(err, str(path))) from None


def config_from_dict(data: dict, source: str = "<config>", *, stored: bool = False) -> RunConfig:
    """Validate `data` into a `RunConfig`. `stored`: a config a run already holds (its stored config, or the one
    handed to its workers), loaded as it was made: a decision split a config read now may not name is let through,
    and flagged (`LessonsConfig.held_out_decisions`, `ConsolidationConfig.held_out_decisions`)."""
    try:
        return RunConfig.model_validate(data, context={"stored": stored})
    except ValidationError as err:
        raise ConfigError(_format_errors(err, source)) from None
