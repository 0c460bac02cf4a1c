"""The files a run owns in its workdir, written without following a symbolic link (`open_owned`), and the resolved
config written beside every run (`save_resolved`)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import yaml

from agent_runtime.config.schema import ConfigError, RunConfig
from memory.redaction import redact_secrets


class UnsafePathError(ConfigError):
    """A file the runtime owns in the workdir is a symbolic link: it is never followed."""


def open_owned(path: Path, mode: str = "w", encoding: str = "utf-8"):
    """Open a file the runtime owns (`w`: replaced, `a`: appended to) without following a symbolic link: a link
    planted at `path` would have the write land on its target."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if mode == "a" else os.O_TRUNC) | getattr(os, "O_NOFOLLOW", 0)
    if path.is_symlink():
        raise UnsafePathError(
            f"{path} is a symbolic link (to {os.readlink(path)}); the runtime never writes "
            "through one: remove the link (or use another workdir) and start again"
        )
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePathError(
                f"{path} is a symbolic link; the runtime never writes through one: remove it "
                "(or use another workdir) and start again"
            ) from None
        raise
    return os.fdopen(fd, mode, encoding=encoding)


def save_resolved(config: RunConfig, workdir: Path) -> Path:
    """Write the resolved config next to the run's data (secrets redacted), never through a symbolic link."""
    workdir.mkdir(parents=True, exist_ok=True)
    out = workdir / "config.resolved.yaml"
    with open_owned(out) as fh:
        fh.write(yaml.safe_dump(redact_secrets(config.model_dump(mode="json")), sort_keys=False))
    return out
