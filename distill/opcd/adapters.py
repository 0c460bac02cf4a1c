"""Adapter I/O: write trained weights atomically, load them back, clean up after a killed write.

A consolidation cycle can be killed at any moment (SIGKILL included) and restarted. So an adapter directory
either exists complete or not at all: everything is written into a hidden temporary sibling
(`.<name>.partial-<random>`), flushed, and renamed into place in one `os.rename` (atomic on POSIX within a
filesystem). A killed write leaves only a `.partial-` sibling, which `remove_partial_writes` deletes on the
next start. Each directory also carries `opcd.json`: the resolved config and the run's summary, so an
adapter says how it was made.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

METADATA_FILE = "opcd.json"
_PARTIAL = ".partial-"


class AdapterExistsError(FileExistsError):
    """The target adapter directory exists already; adapters are immutable once written."""


@contextlib.contextmanager
def atomic_directory(target: str | Path, *, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary directory that becomes `target` only if the block completes.

    On an exception the temporary directory is removed and `target` is untouched. With `overwrite`, an
    existing `target` is replaced (moved aside first, then deleted), otherwise it is an error.
    """
    target = Path(target)
    if target.exists() and not overwrite:
        raise AdapterExistsError(
            f"{target} exists already; adapters are written once (pick a new path, or pass overwrite=True)"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{target.name}{_PARTIAL}", dir=target.parent))
    try:
        yield partial
        _fsync_tree(partial)
        if target.exists():
            aside = Path(tempfile.mkdtemp(prefix=f".{target.name}{_PARTIAL}old-", dir=target.parent))
            os.rename(target, aside / target.name)
            os.rename(partial, target)
            shutil.rmtree(aside)
        else:
            os.rename(partial, target)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


def _fsync_tree(directory: Path) -> None:
    for path in directory.rglob("*"):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())


def remove_partial_writes(directory: str | Path) -> list[Path]:
    """Delete the leftovers of writes killed before their rename; returns what was removed."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    removed = [p for p in directory.iterdir() if p.name.startswith(".") and _PARTIAL in p.name]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed


def write_metadata(directory: Path, metadata: dict[str, Any]) -> None:
    (directory / METADATA_FILE).write_text(json.dumps(metadata, indent=2, sort_keys=True, default=str))


def read_metadata(directory: str | Path) -> dict[str, Any]:
    """The `opcd.json` of an adapter directory ({} for adapters written by something else)."""
    path = Path(directory) / METADATA_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def load_adapter(model, path: str | Path, *, trainable: bool = False, adapter_name: str = "default"):
    """Wrap a base `model` with the LoRA adapter saved at `path` (a peft directory); returns the PeftModel."""
    from peft import PeftModel

    path = Path(path)
    if not (path / "adapter_config.json").exists():
        raise FileNotFoundError(
            f"{path} holds no LoRA adapter (no adapter_config.json); a full fine-tune is "
            "loaded with from_pretrained instead"
        )
    return PeftModel.from_pretrained(model, str(path), adapter_name=adapter_name, is_trainable=trainable)
