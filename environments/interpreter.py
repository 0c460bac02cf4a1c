"""What may be typed into a game interpreter, and the interpreter in a process of its own.

TextWorld compiles its games to Z-machine files that jericho's frotz plays in-process. Two kinds of
input are dangerous there:

- bytes the interpreter cannot take: frotz hangs on a NUL, loops forever on an unknown backslash
  command and crashed the process on some long non-ASCII input. `safe_command` keeps printable
  ASCII on one line, bounded in length.
- commands addressed to the interpreter rather than the story: `save` one step before the end of a
  game and `restore` in a later episode of the same task wins in two steps; `script` and `save` write
  files into the working directory; `restart`, `undo`, `verbose`, ... change the state outside the
  game's rules; TextWorld's own framework commands (`print_state`, `tw-print ...`) reveal the
  world. `meta_command` finds them: the first word of every clause (Inform splits a line at ".",
  "," and "then") looked up as the Z-machine dictionary does (lower case, cut to 9 Z-characters),
  against Inform 7's out-of-world actions and parser words, Inform's debugging verbs, the words
  jericho's `defines.ILLEGAL_ACTIONS` lists and TextWorld's framework commands. Game environments
  answer them as an unknown verb (`UNKNOWN_VERB`): no reward, no state change, one step of the
  budget. No built-in game has a verb among these words (a test checks every admissible action).
- lines the parser would read as several objects or several commands: TextWorld answers "take all"
  with "You have to be more specific!", but "take all.", "get everything from fridge", "take all but
  knife", "take X and Y", "take X, Y" or "take X. take Y" / "take X then take Y" all reach Inform's
  multi-object parser or run several commands in one step, and take every ingredient for one step of
  the budget. `multi_command` finds them: any of Inform's ALL/AND/BUT words (all, each, every,
  everything, both, and, but, except) or a comma between words, and a second command after "." or
  "then", whatever the case, spacing or punctuation around them. Game environments refuse them
  (`ONE_AT_A_TIME`) unless the line is exactly one of the game's admissible actions.

`InterpreterProcess` is the second line: it runs the TextWorld environment in a child process whose
working directory is a private temporary folder, emptied at every reset (so nothing a game wrote
carries into the next episode) and removed on close. A hung or crashed interpreter costs the child
(killed after a timeout, reported as `InterpreterError`), never the runtime. Game processes are forked
from a small fork server of ours that imports textworld once, so a new one costs milliseconds; what a
game process prints goes to a log in its folder, quoted in the error when it dies.
"""

from __future__ import annotations

import json
import multiprocessing.connection
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from environments.base import EnvError

MAX_COMMAND_CHARS = 200
UNKNOWN_VERB = "That's not a verb I recognise."
ONE_AT_A_TIME = "You have to be more specific! Give one command about one thing at a time."

# Inform 7 out-of-world actions and their Inform 6 synonyms, and the parser's own words (again, oops, undo)
_INFORM = (
    "quit q die save restore restart verify undo oops o again g score fullscore full notify pronouns "
    "nouns version script transcript unscript noscript superbrief short verbose long brief normal "
    "recording replay"
)
# Inform's debugging verbs (present in debug builds)
_INFORM_DEBUG = (
    "actions rules scenes showme showverb showheap gonear purloin abstract tree trace random responses test relations"
)
# the rest of jericho's defines.ILLEGAL_ACTIONS (meta words of the games jericho supports)
_JERICHO = (
    "license licence lisense lisence copyright terms eula info tutorial changes daemons messages win "
    "lose quotes hint hints menu walkthru walkthrou walkthrough manual about clue clues credit credits "
    "places objects"
)
# TextWorld's framework commands (textworld/generator/inform7/world2inform7.py); "tw-..." all start alike
_TEXTWORLD = "print_state enable disable restrict"
_TEXTWORLD_PREFIX = "tw-"
_CLAUSE_BREAK = re.compile(r'[.,"]|\bthen\b')
_ALPHABET_A0 = frozenset("abcdefghijklmnopqrstuvwxyz")
_DICTIONARY_ZCHARS = 9  # Z-machine version 4+: a dictionary word keeps 9 Z-characters


def safe_command(action: str) -> str:
    """What the Z-machine interpreter can take: printable ASCII on one line, bounded in length.

    A backslash starts one of dumb-frotz's own commands (an unknown one makes it loop forever,
    printing), so it is dropped with the control and non-ASCII characters; the game then answers the
    cleaned command with its own feedback.
    """
    cleaned = "".join(ch if 32 <= ord(ch) < 127 and ch != "\\" else " " for ch in action)
    return " ".join(cleaned.split())[:MAX_COMMAND_CHARS]


def dictionary_word(word: str) -> str:
    """`word` as the Z-machine dictionary stores it: lower case, cut after 9 Z-characters (a-z take one,
    every other printable character two), so "superbriefly" and "superbrief" are the same word."""
    kept, used = [], 0
    for ch in word.lower():
        used += 1 if ch in _ALPHABET_A0 else 2
        if used > _DICTIONARY_ZCHARS:
            break
        kept.append(ch)
    return "".join(kept)


_META = frozenset(dictionary_word(w) for w in f"{_INFORM} {_INFORM_DEBUG} {_JERICHO} {_TEXTWORLD}".split())


def meta_command(action: str) -> str | None:
    """The interpreter meta-command in `action` (the word as typed, lower case), or None for a game command.

    `action` is judged as the interpreter would receive it, after `safe_command`.
    """
    for clause in _CLAUSE_BREAK.split(safe_command(action).lower()):
        words = clause.split()
        if words and (dictionary_word(words[0]) in _META or words[0].startswith(_TEXTWORLD_PREFIX)):
            return words[0]
    return None


# Inform's words that make a noun phrase name several objects (English.i6t: ALL1__WD..ALL5__WD, AND*, BUT*)
_MULTI = frozenset(dictionary_word(w) for w in ("all", "each", "every", "everything", "both", "and", "but", "except"))
_TOKENS = re.compile(r'[.,"]|[^\s.,"]+')  # Inform's words: ".", "," and '"' are words of their own
_THEN = ".", "then"  # a command break (Inform's THEN words and the full stop)


def multi_command(action: str) -> str | None:
    """What makes `action` several objects or several commands at once (the word or mark, lower case), or
    None for a line the parser reads as one command about one thing.

    `action` is judged as the interpreter would receive it, after `safe_command`: a trailing full stop or
    comma alone is harmless, a word after one is a second command or object.
    """
    commands, words, comma, last_break = 0, 0, False, "."
    for token in _TOKENS.findall(safe_command(action).lower()):
        if token in _THEN:
            commands, words, comma, last_break = commands + (words > 0), 0, False, token
        elif token == ",":
            comma = comma or words > 0
        elif token != '"':
            if comma:
                return ","
            if commands:
                return last_break
            if dictionary_word(token) in _MULTI:
                return token
            words += 1
    return None


class InterpreterError(EnvError):
    """The game interpreter process failed, hung or exited; the environment must be reset (or remade)."""


class _ForkServer:
    """A child that imported textworld once (1-2 s) and forks a game process per request (milliseconds).

    multiprocessing's own fork server re-runs the parent's main script in every child, so this one is
    ours: `python -m environments.interpreter FD` reads requests (workdir, log, and a socket passed as
    a file descriptor) on a Unix socket, forks, and answers with the game's pid. It is single-threaded,
    so forking it is safe where forking the runtime (torch, Ray, threads) is not, and it exits when the
    runtime goes away (end of file on its socket).
    """

    _lock = threading.Lock()
    _instance: _ForkServer | None = None

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = dict(os.environ)
        package_parent = str(Path(__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", __name__, str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            cwd=os.sep,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
        theirs.close()
        self.sock, self.owner = ours, os.getpid()

    @classmethod
    def fork(cls, workdir: Path, log: Path) -> tuple[int, socket.socket]:
        """A new game process working in `workdir`: its pid and the parent's end of its socket."""
        with cls._lock:
            server = cls._instance  # a forked copy of the runtime starts its own: the socket is not shared
            if server is None or server.owner != os.getpid() or server.proc.poll() is not None:
                cls._instance = cls()
            server = cls._instance
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                request = json.dumps({"workdir": str(workdir), "log": str(log), "owner": os.getpid()}).encode()
                socket.send_fds(server.sock, [request], [theirs.fileno()])
                reply = server.sock.recv(64)
            except OSError as exc:
                ours.close()
                raise InterpreterError(f"the game process server failed: {exc}") from None
            finally:
                theirs.close()
        if not reply:
            ours.close()
            raise InterpreterError(f"the game process server exited (code {server.proc.wait()})")
        return int(reply), ours


def _shutdown(held: dict[str, Any], root: Path) -> None:
    conn = held.get("conn")
    if conn is not None:
        try:
            conn.send_bytes(json.dumps({"op": "close"}).encode())
        except OSError:
            pass
        conn.close()  # a child that did not read "close" reads the end of file and exits as well
    held["conn"] = held["pid"] = None
    shutil.rmtree(root, ignore_errors=True)


class InterpreterProcess:
    """A TextWorld environment (`textworld.start`) in a child process with a private working directory.

    `load(game_file, infos)` starts (or switches) the game, `reset()` and `step(command)` return the game
    state as a dict of the requested fields plus "feedback"; `close()` ends the child and removes its
    folder. The child starts on the first load and is reused for later loads. Answers come back as JSON,
    so nothing the game process sends is ever unpickled here.
    """

    LOAD_TIMEOUT_S = 300.0
    STEP_TIMEOUT_S = 60.0

    def __init__(self) -> None:
        self._root = Path(tempfile.mkdtemp(prefix="agent-runtime-game-"))
        self.workdir = self._root / "cwd"
        self.workdir.mkdir()
        self._log = self._root / "interpreter.log"
        self._held: dict[str, Any] = {"conn": None, "pid": None}
        self._finalizer = weakref.finalize(self, _shutdown, self._held, self._root)

    @property
    def pid(self) -> int | None:
        """The game process's id (None when none is running)."""
        return self._held["pid"]

    @property
    def alive(self) -> bool:
        """Whether the game process is there (a dead one has left an end of file to read)."""
        conn = self._held["conn"]
        try:
            return conn is not None and not conn.poll(0)
        except OSError:
            return False

    def _spawn(self) -> None:
        self._drop()
        pid, sock = _ForkServer.fork(self.workdir, self._log)
        self._held.update(pid=pid, conn=multiprocessing.connection.Connection(sock.detach()))

    def _drop(self, kill: bool = False) -> None:
        conn, pid = self._held["conn"], self._held["pid"]
        if kill and pid is not None:
            try:  # the game is hung, so alive: its pid cannot have been reused
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if conn is not None:
            conn.close()
        self._held["conn"] = self._held["pid"] = None

    def _fail(self, message: str, kill: bool = False) -> InterpreterError:
        self._drop(kill)
        tail = self._log.read_text(errors="replace")[-800:].strip() if self._log.exists() else ""
        return InterpreterError(message + (f"; its last words: {tail}" if tail else ""))

    def _call(self, request: dict[str, Any], timeout: float) -> Any:
        conn = self._held["conn"]
        if conn is None:
            raise InterpreterError("the game interpreter is not running; reset the environment")
        try:
            conn.send_bytes(json.dumps(request).encode())
            if not conn.poll(timeout):
                raise self._fail(
                    f"the game interpreter gave no answer to {request['op']} "
                    f"{request.get('command', '')!r} within {timeout:.0f} s and was killed",
                    kill=True,
                )
            answer = json.loads(conn.recv_bytes())
        except (EOFError, OSError) as exc:
            raise self._fail(f"the game interpreter exited during {request['op']} ({type(exc).__name__})") from None
        if "error" in answer:
            raise InterpreterError(f"the game interpreter failed on {request['op']}: {answer['error']}")
        return answer["ok"]

    def load(self, game_file: str | Path, infos: dict[str, Any]) -> None:
        """Start `game_file` with `textworld.EnvInfos(**infos)` (starting the child when needed)."""
        if not self.alive:
            self._spawn()
        self._call({"op": "load", "path": str(Path(game_file).resolve()), "infos": infos}, self.LOAD_TIMEOUT_S)

    def reset(self) -> dict[str, Any]:
        """A new episode of the loaded game, in an emptied working directory."""
        for entry in self.workdir.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
        return self._call({"op": "reset"}, self.LOAD_TIMEOUT_S)

    def step(self, command: str) -> tuple[dict[str, Any], bool]:
        """Send `command` as typed; the game state after it and whether the game says it is done."""
        state, done = self._call({"op": "step", "command": command}, self.STEP_TIMEOUT_S)
        return state, bool(done)

    def close(self) -> None:
        """End the child and remove its folder (idempotent)."""
        self._finalizer()


# -- the child processes ------------------------------------------------------------------------------
def _fields(state: Any, infos: Any) -> dict[str, Any]:
    keys = ["feedback", *infos.basics, *(f"extra.{name}" for name in infos.extras)]
    return {key: state.get(key) for key in keys}


def _play(conn: multiprocessing.connection.Connection) -> bool:
    """A game process: answer requests until "close" (True) or until the parent goes away (False): an end of
    file, or a reset or broken connection when the parent was killed with a request in flight or before reading
    the answer."""
    env, infos, closed = None, None, False
    while True:
        try:
            request = json.loads(conn.recv_bytes())
        except (EOFError, OSError):
            break
        op = request["op"]
        if op == "close":
            closed = True
            break
        try:
            if op == "load":
                import textworld

                if env is not None:
                    env.close()
                infos = textworld.EnvInfos(**request["infos"])
                env = textworld.start(request["path"], request_infos=infos)
                result: Any = None
            elif op == "reset":
                result = _fields(env.reset(), infos)
            elif op == "step":
                state, _, done = env.step(request["command"])
                result = (_fields(state, infos), bool(done))
            else:
                raise ValueError(f"unknown request {op!r}")
            answer = {"ok": result}
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises InterpreterError
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        try:
            conn.send_bytes(json.dumps(answer, default=str).encode())
        except OSError:
            break
    if env is not None:
        env.close()
    return closed


def _alive(pid: int) -> bool:
    """Whether process `pid` still runs (a killed one not yet reaped by its parent, a zombie, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:  # no such process (or no /proc: ask the kernel)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def _gone(pid: int, wait_s: float = 10.0) -> bool:
    """Whether process `pid` ends within `wait_s`. A killed process closes its files (the end of file a game
    process reads) a moment before it shows as exited, so one look right after the end of file can miss it."""
    deadline = time.monotonic() + wait_s
    while _alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def _serve_forks(control: socket.socket) -> None:
    """The fork server's loop (see `_ForkServer`)."""
    import warnings

    warnings.simplefilter("ignore")  # jericho: "not fully supported" is about its own score tracking
    try:  # imported once here, inherited by every game process
        import textworld
        import textworld.envs.wrappers.tw_inform7
        import textworld.envs.zmachine.jericho  # noqa: F401
    except ImportError:
        pass  # the game's load reports it
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # game processes are reaped by the system
    while True:
        request, fds, _, _ = socket.recv_fds(control, 4096, 1)
        if not request:
            return
        task = json.loads(request)
        pid = os.fork()
        if pid == 0:
            control.close()
            code = 0
            try:
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                os.chdir(task["workdir"])
                output = os.open(task["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
                for fd in (1, 2):  # what the game or a library prints is kept for the error message
                    os.dup2(output, fd)
                closed = False
                try:
                    closed = _play(multiprocessing.connection.Connection(fds[0]))
                finally:  # the runtime was killed: nobody else removes the folder
                    if not closed and _gone(task["owner"]):
                        shutil.rmtree(Path(task["workdir"]).parent, ignore_errors=True)
            except BaseException:  # noqa: BLE001 - a game process never returns into the server's loop
                code = 1
            finally:
                os._exit(code)
        os.close(fds[0])
        try:
            control.sendall(str(pid).encode())
        except OSError:  # the runtime went away mid-request: nothing left to serve
            return


if __name__ == "__main__":
    _serve_forks(socket.socket(fileno=int(sys.argv[1])))
