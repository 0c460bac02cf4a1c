"""A cache of generated games shared by every workdir, process and thread: one folder per game, built once,
and played only when it is provably the game built for its key.

Layout: `<root>/<key>/` holds one game's files and its `manifest.json`. `key` is a hash of everything that
decides the game (the family or challenge, its options, the seed, and the generator's version: the generating
library's version plus a constant in our code that is bumped when our generation changes), so two
configurations never share a game that differs. `root` is `environments.episodic.resolve_cache_dir` plus a
folder per family: an environment's explicit `cache_dir` wins, else `$AGENT_RUNTIME_CACHE/games`, else
`~/.cache/agent-runtime/games`.

Trusted only when it can be (the keys are predictable, so anyone able to write the cache could otherwise put an
easy game under a hard game's key and have it played):

- the manifest, written at build time, lists every file of the entry with its sha256 and size, and the key with
  the inputs it was hashed from. An entry is played only if its manifest names this key and these inputs and
  every file matches it, with no file more; anything else (a tampered or truncated file, another key's game
  copied in, an entry of an older version without a manifest) is moved aside and rebuilt;
- no symlink is followed below the root: an entry or a file that is a symlink is rebuilt, a lock path that is
  one is refused (`UntrustedCacheError`) and nothing is created at its target. Files are opened relative to
  their folder's descriptor with `O_NOFOLLOW`;
- the root, every entry and every file must belong to this user and be writable by no one else (group or
  world): otherwise `UntrustedCacheError` says which path and how to fix it, and nothing is deleted, since
  another user may have put it there. Builds chmod what they write, so a group-writable umask is no problem;
- a lock somebody else holds is waited for `lock_timeout` seconds (`$AGENT_RUNTIME_CACHE_LOCK_TIMEOUT`,
  default 10 minutes, as a game can take minutes to generate), then `CacheLockTimeout` names the lock file and
  the processes holding it. Lock files are created `0o600` in a `0o700` folder, so no other user can hold one.
  SIGTERM or SIGINT during a wait in the main thread ends it: the handler in place runs first (the run loop
  notes its stop), then `LockWaitInterrupted` (a `SystemExit` with status 128 + the signal) unwinds the
  process, so no `except Exception` counts it as a failed episode and the run's unplayed draws stay open for its
  resume. A wait in another thread ends at the timeout.

Safe for concurrent use:

- a game is built into a temporary folder `<root>/.gen-<key>-*` on the same filesystem, checked, and renamed
  into place in one step, so a reader sees no folder or a complete one, never a half-written game;
- builders of one key take the advisory lock `<root>/.locks/<key>` (`flock`), so a second builder waits and
  then finds the first one's game instead of building it again. On a filesystem that refuses `flock` the rename
  still settles a race: the first folder in place wins, the other copy is dropped;
- temporary and moved-aside folders older than `STALE_AFTER_S` (what a killed process leaves) are deleted
  whenever a game is next built under that root. Younger ones are left alone: they may be live builds.

POSIX only (`O_NOFOLLOW`, owner ids, `flock`), like the interpreter that plays the games.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import shutil
import signal
import stat
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from environments.base import EnvError
from environments.episodic import resolve_cache_dir

__all__ = [
    "BUILT",
    "LOCK_TIMEOUT_S",
    "STALE_AFTER_S",
    "CacheLockTimeout",
    "GameCacheError",
    "LockWaitInterrupted",
    "UntrustedCacheError",
    "cache_key",
    "cached_entry",
    "clean_stale",
    "run_games_dir",
    "trusted_files",
]

log = logging.getLogger(__name__)

STALE_AFTER_S = 6 * 3600  # a temporary folder this old belongs to no live build
LOCK_TIMEOUT_S = 600.0  # a lock held longer than this is a stuck process, not a slow build
MANIFEST = "manifest.json"
_MANIFEST_FORMAT = 1
_MANIFEST_MAX_BYTES = 1 << 20
_TEMP_PREFIXES = (".gen-", ".trash-")
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # a planted FIFO never blocks


BUILT = {"games": 0, "seconds": 0.0}
"""Games this process generated, and the wall seconds it took (what a run's profile reads:
`agent_runtime.state.profile`)."""


class GameCacheError(EnvError):
    """The game cache cannot give a game that can be trusted."""


class UntrustedCacheError(GameCacheError, PermissionError):
    """Something in the cache another user could have written, or a symlink where none is followed."""


class CacheLockTimeout(GameCacheError, TimeoutError):
    """A game's lock stayed held by another process for longer than the timeout."""


class LockWaitInterrupted(SystemExit):
    """SIGTERM or SIGINT arrived while waiting for a game's lock: the process ends (status 128 + the signal)."""


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


def _lock_timeout() -> float:
    raw = os.environ.get("AGENT_RUNTIME_CACHE_LOCK_TIMEOUT")
    if raw is None:
        return LOCK_TIMEOUT_S
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise GameCacheError(
            f"AGENT_RUNTIME_CACHE_LOCK_TIMEOUT={raw!r} is not a number of seconds above 0; accepted: a positive "
            f"number of seconds to wait for a game's lock, e.g. {LOCK_TIMEOUT_S:g} (the default)"
        )
    return seconds


def _check_owner(path: Path | str, info: os.stat_result, what: str) -> None:
    """Refuse `path` unless this user owns it and no one else (group, world) can write it."""
    if info.st_uid != os.geteuid():
        raise UntrustedCacheError(
            f"{what} {path} belongs to uid {info.st_uid}, not to you (uid {os.geteuid()}): a game another user "
            "put there would be played. Accepted: a game cache you own; point AGENT_RUNTIME_CACHE (or the "
            "environment's cache_dir) at one, or delete this path if you know where it came from"
        )
    if info.st_mode & _OTHERS_WRITE:
        raise UntrustedCacheError(
            f"{what} {path} is writable by other users (mode {stat.S_IMODE(info.st_mode):#o}): a game they put "
            f"there would be played. Accepted: writable by you alone; run `chmod go-w {path}` if nobody else "
            "has written to it, or point AGENT_RUNTIME_CACHE (or the environment's cache_dir) at a fresh folder"
        )


def _open_root(root: Path) -> int:
    """A descriptor of the cache root, once its owner and mode are checked.

    The root itself may be reached through a symlink the user chose; the folder it resolves to is checked.
    """
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _check_owner(root, os.fstat(fd), "the game cache")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _make_root(root: Path) -> None:
    """Create the cache root `0o755` whatever the umask (only we may write it); its parents as usual."""
    if root.is_dir():
        return
    root.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(root, 0o755)
        os.chmod(root, 0o755)


def _open_in(dir_fd: int, name: str, flags: int) -> int | None:
    """`name` opened under `dir_fd` without following a symlink; None if it is missing or a symlink."""
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # a symlink (or not a folder where one is needed)
            return None
        raise


def _sha256(fd: int) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    while chunk := os.read(fd, 1 << 20):
        digest.update(chunk)
        size += len(chunk)
    return digest.hexdigest(), size


def _normalised(inputs: dict[str, Any]) -> Any:
    return json.loads(json.dumps(inputs, sort_keys=True))


def _entry_fault(root_fd: int, root: Path, key: str, inputs: dict[str, Any], files: Sequence[str]) -> str | None:
    """Why the entry `<root>/<key>` cannot be played as the game of `key` and `inputs` (None: it can).

    Raises `UntrustedCacheError` for a folder or file another user could have written.
    """
    entry_fd = _open_in(root_fd, key, _DIR_FLAGS)
    if entry_fd is None:
        return "missing, a symlink or not a folder"
    try:
        _check_owner(root / key, os.fstat(entry_fd), "the game cache entry")
        manifest_fd = _open_in(entry_fd, MANIFEST, _FILE_FLAGS)
        if manifest_fd is None:
            return "no manifest (an older version's entry)"
        with os.fdopen(manifest_fd, "rb") as handle:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode):
                return "a manifest that is not a regular file"
            _check_owner(root / key / MANIFEST, info, "the game cache file")
            try:
                manifest = json.loads(handle.read(_MANIFEST_MAX_BYTES + 1))
            except ValueError:
                return "an unreadable manifest"
        if not isinstance(manifest, dict) or manifest.get("format") != _MANIFEST_FORMAT:
            return "a manifest of another format"
        if manifest.get("key") != key or manifest.get("inputs") != _normalised(inputs):
            return f"the manifest of another game (key {manifest.get('key')!r})"
        listed = manifest.get("files")
        if not isinstance(listed, dict) or not set(files) <= set(listed):
            return "a manifest missing some of the game's files"
        if set(os.listdir(entry_fd)) != {*listed, MANIFEST}:
            return "files its manifest does not list, or not all it lists"
        for name, expected in listed.items():
            fd = _open_in(entry_fd, name, _FILE_FLAGS)
            if fd is None:
                return f"{name} missing or a symlink"
            with os.fdopen(fd, "rb") as handle:
                info = os.fstat(handle.fileno())
                if not stat.S_ISREG(info.st_mode):
                    return f"{name} not a regular file"
                _check_owner(root / key / name, info, "the game cache file")
                if expected != dict(zip(("sha256", "size"), _sha256(handle.fileno()), strict=True)):
                    return f"{name} not the file its manifest lists"
        return None
    finally:
        os.close(entry_fd)


def _seal(folder: Path, key: str, inputs: dict[str, Any], files: Sequence[str]) -> None:
    """Check what a build wrote into `folder`, make it ours alone to write, and write its manifest."""
    listed = {}
    for name in sorted(os.listdir(folder)):
        info = os.lstat(folder / name)
        if not stat.S_ISREG(info.st_mode):
            raise UntrustedCacheError(
                f"building game {key} wrote {name}, which is not a regular file (a symlink or a folder); "
                "accepted: plain files, which is all the cache plays"
            )
        os.chmod(folder / name, 0o644)
        fd = os.open(folder / name, _FILE_FLAGS)
        try:
            digest, size = _sha256(fd)
        finally:
            os.close(fd)
        listed[name] = {"sha256": digest, "size": size}
    missing = [name for name in files if not listed.get(name, {}).get("size")]
    if missing:
        raise GameCacheError(f"building game {key} under {folder.parent} wrote no (or empty) {', '.join(missing)}")
    manifest = {"format": _MANIFEST_FORMAT, "key": key, "inputs": _normalised(inputs), "files": listed}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
    os.chmod(folder / MANIFEST, 0o644)
    os.chmod(folder, 0o755)  # mkdtemp's 0o700 would hide the game from other readers; only we write it


def trusted_files(folder: Path, names: Sequence[str]) -> bool:
    """Whether every one of `names` in `folder` (a cache root) is a non-empty regular file, no symlink, that is
    ours alone to write: the test for an old workdir's flat `<key>.z8`-style games, which have no manifest."""
    if not folder.is_dir():
        return False
    root_fd = _open_root(folder)
    try:
        for name in names:
            try:
                info = os.stat(name, dir_fd=root_fd, follow_symlinks=False)
            except FileNotFoundError:
                return False
            if not stat.S_ISREG(info.st_mode) or not info.st_size:
                return False
            _check_owner(folder / name, info, "the game cache file")
        return True
    finally:
        os.close(root_fd)


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


def _lock_holders(info: os.stat_result) -> str:
    """The processes holding a lock on the file `info` describes, as /proc/locks lists them (Linux)."""
    device = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return "another process (no /proc/locks here to say which)"
    pids = sorted({line.split()[4] for line in lines if "->" not in line and line.split()[5:6] == [device]})
    return f"pid {', pid '.join(pids)}" if pids else "another process (which one has let go since)"


@contextlib.contextmanager
def _stops_end_waiting(lock: Path) -> Iterator[None]:
    """While waiting in the main thread, SIGTERM and SIGINT run the handler in place, then end the wait.

    A handler that only notes the request (the run loop's graceful stop) would otherwise leave the process
    waiting; default dispositions are left alone, since they end the process by themselves.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def interrupt(signum, frame):
        previous[signum](signum, frame)
        log.warning("stopping: signal %d arrived while waiting for the game cache lock %s", signum, lock)
        raise LockWaitInterrupted(128 + signum)

    chained = {sig: old for sig, old in previous.items() if callable(old)}
    for sig in chained:
        signal.signal(sig, interrupt)
    try:
        yield
    finally:
        for sig, old in chained.items():
            signal.signal(sig, old)


@contextlib.contextmanager
def _locked(root: Path, root_fd: int, key: str, timeout: float) -> Iterator[None]:
    """Hold the advisory lock of `key`, waiting at most `timeout` seconds (a no-op where `flock` is refused)."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(".locks", 0o700, dir_fd=root_fd)
    locks_fd = _open_in(root_fd, ".locks", _DIR_FLAGS)
    if locks_fd is None:
        raise UntrustedCacheError(
            f"{root / '.locks'} is a symlink or not a folder; the game cache follows no symlink. Accepted: a "
            "folder of lock files: delete this path and it is made again"
        )
    path = root / ".locks" / key
    try:
        if os.fstat(locks_fd).st_uid == os.geteuid():
            os.fchmod(locks_fd, 0o700)  # an older version's was readable by all, which let anyone hold its locks
        _check_owner(root / ".locks", os.fstat(locks_fd), "the game cache's lock folder")
        try:  # each open is its own lock owner, so threads exclude one another too
            fd = os.open(key, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=locks_fd)
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            raise UntrustedCacheError(
                f"the lock {path} is a symlink; the game cache follows no symlink and created nothing at its "
                "target. Accepted: a plain lock file, or none: delete the link and it is made again"
            ) from None
    finally:
        os.close(locks_fd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UntrustedCacheError(f"the lock {path} is not a regular file; delete it and it is made again")
        _check_owner(path, info, "the game cache lock")
        os.fchmod(fd, 0o600)  # a lock file of an older version was readable, so anyone could hold it
        _acquire(fd, path, timeout)
        yield  # closing the file releases the lock
    finally:
        os.close(fd)


def _acquire(fd: int, path: Path, timeout: float) -> None:
    """Take the `flock` on `fd`, polling with short sleeps so that signal handlers run while waiting."""
    deadline, pause = time.monotonic() + timeout, 0.01
    with _stops_end_waiting(path):
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                pass
            except OSError:  # a filesystem without flock: the rename still decides
                return
            if time.monotonic() >= deadline:
                raise CacheLockTimeout(
                    f"waited {timeout:g}s for the game cache lock {path}, held by {_lock_holders(os.fstat(fd))}: a "
                    "build taking longer than that, or a stuck process. Stop that process, or allow a longer wait "
                    "with AGENT_RUNTIME_CACHE_LOCK_TIMEOUT (seconds)"
                )
            time.sleep(pause)
            pause = min(pause * 2, 0.25)


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


def cached_entry(
    root: str | Path,
    key: str,
    files: Sequence[str],
    build: Callable[[Path], None],
    *,
    inputs: dict[str, Any],
    lock_timeout: float | None = None,
) -> Path:
    """The folder `<root>/<key>` holding the game `key` was hashed from (`inputs`), with at least `files`.

    Calls `build(tmp)` to write the game's files into a fresh temporary folder when the entry is missing or does
    not match its manifest, and records `inputs` in the new manifest. `build` may raise: nothing is then left in
    place. `lock_timeout` (seconds) defaults to `$AGENT_RUNTIME_CACHE_LOCK_TIMEOUT`, else `LOCK_TIMEOUT_S`.
    Raises `UntrustedCacheError` for a cache another user could write, `CacheLockTimeout` for a lock held too long.
    """
    root = Path(root)
    folder = root / key
    _make_root(root)
    root_fd = _open_root(root)
    try:
        if _entry_fault(root_fd, root, key, inputs, files) is None:
            return folder
        with _locked(root, root_fd, key, _lock_timeout() if lock_timeout is None else lock_timeout):
            clean_stale(root)
            fault = _entry_fault(root_fd, root, key, inputs, files)
            if fault is None:
                return folder  # another worker built it while this one waited for the lock
            if os.path.lexists(folder):
                log.info("rebuilding game cache entry %s: %s", folder, fault)
                _discard(folder, root, key)
            tmp = Path(tempfile.mkdtemp(prefix=f".gen-{key}-", dir=root))
            started = time.perf_counter()
            try:
                build(tmp)
                BUILT["games"] += 1
                BUILT["seconds"] += time.perf_counter() - started
                _seal(tmp, key, inputs, files)
                try:
                    os.rename(tmp, folder)  # atomic: the entry appears complete or not at all
                except OSError:  # another worker (without the lock) put its copy in place first
                    if _entry_fault(root_fd, root, key, inputs, files) is not None:
                        raise
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        return folder
    finally:
        os.close(root_fd)
