"""Run configuration: `schema` (the pydantic models of a `RunConfig`), `loading` (YAML and dicts into one, `--set`
overrides), `resume` (what `run --resume` may take from a stored config) and `files` (the files a run owns in its
workdir, never through a symbolic link)."""

from agent_runtime.config.files import UnsafePathError, open_owned, save_resolved
from agent_runtime.config.loading import apply_overrides, config_from_dict, load_config
from agent_runtime.config.resume import code_references, resume_differences, stored_config
from agent_runtime.config.schema import (
    ConfigError,
    ConsolidationConfig,
    EnvEntry,
    ModelConfig,
    RunConfig,
    SystemPromptConfig,
)

__all__ = [
    "ConfigError",
    "ConsolidationConfig",
    "EnvEntry",
    "ModelConfig",
    "RunConfig",
    "SystemPromptConfig",
    "UnsafePathError",
    "apply_overrides",
    "code_references",
    "config_from_dict",
    "load_config",
    "open_owned",
    "resume_differences",
    "save_resolved",
    "stored_config",
]
