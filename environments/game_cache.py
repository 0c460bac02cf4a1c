"""A cache of generated games shared by every workdir, process and thread: one folder per game, built once.

Layout: `<root>/<key>/` holds one game's files. `key` is a hash of everything that decides the game (the
family or challenge, its options, the seed, and the generator's version: the generating library's version plus
a constant in our code that is bumped when our generation changes), so two configurations never share a game
that differs. `root` is `environments.episodic.resolve_cache_dir` plus a folder per family: an environment's
explicit `cache_dir` wins, else `$AGENT_RUNTIME_CACHE/games`, else `~/.cache/agent-runtime/games`.

Safe for concurrent use:

- a game is built into a temporary folder `<root>/.gen-<key>-*` on the same filesystem, checked, and renamed
  into place in one step, so a reader sees no folder or a complete one, never a half-written game;
- builders of one key take an advisory lock (`<root>/.locks/<key>`, `flock`), so a second builder waits and
  then finds the first one's game instead of building it again. Without `flock` (another OS, a filesystem
  that refuses it) the rename still settles a race: the first folder in place wins, the other copy is dropped;
- an entry missing one of its files (or holding an empty one) is ignored, moved aside and rebuilt under the
  lock; temporary and moved-aside folders older than `STALE_AFTER_S` (what a killed process leaves) are
  deleted whenever a game is next built under that root. Younger ones are left alone: they may be live builds.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from environments.episodic import resolve_cache_dir

__all__ = ["STALE_AFTER_S", "cache_key", "cached_entry", "clean_stale", "is_complete", "run_games_dir"]

STALE_AFTER_S = 6 * 3600  # a temporary folder this old belongs to no live build
_TEMP_PREFIXES = (".gen-", ".trash-")


BUILT = {"games": 0, "seconds": 0.0}
"""Games this process generated, and the wall seconds it took (what a run's profile reads:
`agent_runtime.run.profile`)."""


def run_games_dir(workdir: str | Path) -> Path:
    """Where a run in `workdir` caches generated games when its config entry names no `cache_dir`.

    The shared cache (`resolve_cache_dir(None)`), so a second workdir of the same config plays the games the
    first one generated. Backward compatibility: a workdir made before the cache was shared has its own
    `<workdir>/games` folder, and a run there keeps using it (reading its games, adding any new one there),
    so a resumed run plays exactly the game files it played before and generates none of them again. New
    workdirs never get a `games` folder.
    """
    legacy = Path(workdir) / "games"
    return legacy if legacy.is_dir() else resolve_cache_dir(None)


def cache_key(payload: dict[str, Any]) -> str:
    """A short stable hash of a JSON-serializable description of a game."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:24]


def _nonempty_file(path: Path) -> bool:
    try:
        return path.is_file() and path.stat().st_size > 0
    except OSError:
        return False


def is_complete(folder: Path, files: Sequence[str]) -> bool:
    """Whether `folder` holds every one of `files`, none of them empty."""
    return all(_nonempty_file(folder / name) for name in files)


def clean_stale(root: Path, older_than: float = STALE_AFTER_S) -> list[str]:
    """Delete the temporary and moved-aside folders under `root` older than `older_than` seconds; their names."""
    removed, now = [], time.time()
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(_TEMP_PREFIXES):
            continue
        try:
            if now - entry.stat(follow_symlinks=False).st_mtime < older_than:
                continue
        except OSError:
            continue  # gone meanwhile
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
        removed.append(entry.name)
    return removed


@contextlib.contextmanager
def _locked(root: Path, key: str) -> Iterator[None]:
    """Hold the advisory lock of `key` (a no-op where `flock` is missing or refused)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: the atomic rename alone settles races
        yield
        return
    locks = root / ".locks"
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / key, "a") as handle:  # each open is its own lock owner, so threads exclude one another too
        with contextlib.suppress(OSError):  # a filesystem without flock: the rename still decides
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield  # closing the file releases the lock


def _discard(folder: Path, root: Path, key: str) -> None:
    """Move a damaged entry aside (one rename, so no reader sees it half-deleted), then delete it."""
    trash = root / f".trash-{key}-{uuid.uuid4().hex[:8]}"
    try:
        os.rename(folder, trash)
    except FileNotFoundError:
        return
    if trash.is_dir() and not trash.is_symlink():
        shutil.rmtree(trash, ignore_errors=True)
    else:
        trash.unlink(missing_ok=True)


def cached_entry(root: str | Path, key: str, files: Sequence[str], build: Callable[[Path], None]) -> Path:
    """The folder `<root>/<key>` holding `files`, calling `build(tmp)` to write them into a fresh temporary
    folder first when the entry is missing or incomplete. `build` may raise: nothing is then left in place."""
    root = Path(root)
    folder = root / key
    if is_complete(folder, files):
        return folder
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root, key):
        clean_stale(root)
        if is_complete(folder, files):
            return folder  # another worker built it while this one waited for the lock
        if folder.exists() or folder.is_symlink():
            _discard(folder, root, key)  # damaged or partial: never used, rebuilt
        tmp = Path(tempfile.mkdtemp(prefix=f".gen-{key}-", dir=root))
        started = time.perf_counter()
        try:
            build(tmp)
            BUILT["games"] += 1
            BUILT["seconds"] += time.perf_counter() - started
            missing = [name for name in files if not _nonempty_file(tmp / name)]
            if missing:
                raise RuntimeError(f"building game {key} under {root} wrote no (or empty) {', '.join(missing)}")
            os.chmod(tmp, 0o755)  # mkdtemp's 0o700 would hide the game from the cache's other users
            try:
                os.rename(tmp, folder)  # atomic: the entry appears complete or not at all
            except OSError:  # another worker (without the lock) put its copy in place first
                if not is_complete(folder, files):
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return folder
