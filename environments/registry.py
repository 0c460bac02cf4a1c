"""The environment registry: `register`, `make`, `list_envs`, and third-party plugins.

One registry pattern (as in Gymnasium and simonw/llm): an id maps to an entry point (a callable, or a
lazy "module:attr" string so that `import environments` never imports TextWorld, ALFWorld or the
math stack) plus default keyword arguments. Third-party packages publish a function in the entry-point
group ``agent_runtime.environments`` that calls `register`; the group is loaded lazily on the first
`make`/`list_envs`, never at import. A plugin that fails to load is remembered with its error and shown
by `list_envs` under its entry-point name, so one broken package never hides the others. Registering an
id twice is an error, whoever does it. ``make("pkg.module:ClassName")`` builds an unpublished
environment class directly, which is how authors try an environment before packaging it.

Code named by a config is data until it is allowed (`check_code`, `check_env_id`): importing a module runs its
top-level code, so a `module:Name` that a config names (an environment id, a chat-model class) is imported only
when that runs nothing the user did not mean to load: the module is already imported, it is one of this
project's own packages, it is a package the caller allows (the chat backend allows LangChain's), or an installed
distribution publishes it as an entry point. Anything else needs the explicit opt-in `trusting_code()` (the
CLI's `--trust-code`; a stored config cannot set it). `make` itself is the Python API: its caller names the
code, so it imports what it is given.

A name is not a place: `python -m` puts the working directory first on the path, and `python script.py` the
script's folder, so a `langchain_evil.py` lying there is found under an allowed name before any installed
package. A package allowed by its name is therefore imported only when it is found directly in a site-packages
folder, where installed distributions put their modules, and this project's own only from the folder beside
this package.

Construction keyword arguments are checked against the entry point's signature before the call, so a
typo gives "textworld/coin_collector does not accept 'levle'; accepted: ..." rather than a TypeError
from deep inside a constructor.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import site
import sys
import sysconfig
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from environments.base import EnvError, TextEnv, UnknownEnvironmentError

ENTRY_POINT_GROUP = "agent_runtime.environments"
BUILTIN = "builtin"


class DuplicateEnvironmentError(EnvError, ValueError):
    """Two registrations (built-in or plugin) claimed the same id."""


class EnvConstructionError(EnvError, TypeError):
    """make() was given keyword arguments the environment does not accept, or built something else."""


class UntrustedCodeError(EnvError, PermissionError):
    """A config names a module that importing would run, and nothing allows it (see `check_code`)."""


# The opt-in to import any module a config names: set by the CLI's --trust-code for the command's duration (an
# environment variable, so that processes the run starts, such as Ray workers on this machine, inherit it).
TRUST_ENV = "AGENT_RUNTIME_TRUST_CODE"
TRUST_HINT = "to allow it, run the command with --trust-code (or set AGENT_RUNTIME_TRUST_CODE=1)"
OWN_PACKAGES = ("agent_runtime", "environments", "distill", "memory", "modelkit")
# Packages of a source checkout of this project (where `tests` and `bench` name its own folders), never
# of another project: allowed only when they resolve to the folder beside this package.
CHECKOUT_PACKAGES = ("tests", "bench")
_ROOT = Path(__file__).resolve().parents[1]


def code_trusted() -> bool:
    """Whether the user opted in to importing any module a config names (`trusting_code`)."""
    return os.environ.get(TRUST_ENV, "") == "1"


@contextmanager
def trusting_code(on: bool = True) -> Iterator[None]:
    """Allow (on=True) any module a config names while the block runs; the previous setting after it."""
    previous = os.environ.get(TRUST_ENV)
    if on:
        os.environ[TRUST_ENV] = "1"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(TRUST_ENV, None)
        else:
            os.environ[TRUST_ENV] = previous


def _folders(spec) -> set[Path]:
    """The folders a found top-level module lies in (a package's parent folder); none for a built-in one."""
    if spec.submodule_search_locations is not None and not spec.has_location:  # a namespace package
        return {Path(loc).resolve().parent for loc in spec.submodule_search_locations}
    if not spec.has_location:  # built into the interpreter or frozen: part of Python
        return set()
    found = Path(spec.origin).resolve()
    return {found.parent.parent if spec.submodule_search_locations is not None else found.parent}


def _site_folders() -> set[Path]:
    """Where installed distributions put their modules: this interpreter's site-packages folders."""
    folders = {sysconfig.get_paths()[key] for key in ("purelib", "platlib")} | set(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        folders.add(site.getusersitepackages())
    return {Path(folder).resolve() for folder in folders}


def _own_package(top: str, spec) -> bool:
    """`top` is one of this project's packages, found in the folder beside this one (a checkout's `tests` and
    `bench` only in a source checkout)."""
    if top not in OWN_PACKAGES and (top not in CHECKOUT_PACKAGES or not (_ROOT / "pyproject.toml").is_file()):
        return False
    return _folders(spec) == {_ROOT}


def _published(spec: str, groups: Sequence[str]) -> bool:
    """Whether an installed distribution publishes `spec` (module:attr) as an entry point of one of `groups`."""
    return any(ep.value.replace(" ", "") == spec for group in groups for ep in entry_points(group=group))


def check_code(
    spec: str, *, what: str, packages: Sequence[str] = (), prefixes: Sequence[str] = (), groups: Sequence[str] = ()
) -> None:
    """Refuse (UntrustedCodeError) to import the module of `spec` ('package.module:Name', which `what` names
    in the message) when importing it could run code the user did not mean to load. Allowed without the opt-in:
    a module already imported (importing it again runs nothing), this project's own packages (from the folder beside
    this one), a top-level package in `packages` or starting with one of `prefixes` found in a site-packages
    folder (anywhere else, say the working directory, it is refused: the name alone proves nothing), and a `spec`
    published as an entry point of one of `groups` by an installed distribution. Unknown modules are let through:
    the import reports them."""
    module_name = spec.partition(":")[0]
    top = module_name.split(".")[0]
    if not module_name or code_trusted() or sys.modules.get(module_name) is not None:
        return
    try:
        found = importlib.util.find_spec(top)  # a top-level name: finding it runs nothing
    except (ImportError, ValueError):
        found = None
    if found is None or _own_package(top, found):
        return
    allowed = ", ".join([*OWN_PACKAGES, *packages, *(f"{p}*" for p in prefixes)])
    if top in packages or top.startswith(tuple(prefixes)):
        outside = _folders(found) - _site_folders()
        if not outside:
            return
        raise UntrustedCodeError(
            f"{what} {spec!r}: refusing to import module {module_name!r}: its name is allowed ({allowed}) only "
            f"from an installed distribution, and {top!r} was found at {found.origin or min(outside)}, in "
            "no installed distribution's folder (site-packages): a file of that name in the working directory or "
            f"a script's folder is not the package. Install the package, run from another directory, or {TRUST_HINT}"
        )
    if _published(spec, groups):
        return
    published = (
        f", or one an installed distribution publishes as an entry point ({', '.join(groups)})" if groups else ""
    )
    raise UntrustedCodeError(
        f"{what} {spec!r}: refusing to import module {module_name!r}: importing a module runs its code, and "
        f"{module_name!r} is neither imported already nor in an allowed package ({allowed}){published}; "
        f"{TRUST_HINT}"
    )


def check_env_id(env_id: str) -> None:
    """An environment id a config names: a registered id, or a `module:Name` that `check_code` allows and
    that names a TextEnv class (checked before anything is called). With the opt-in, any callable, as `make`."""
    _builtins()
    load_plugins()
    if env_id in _registry or ":" not in env_id or code_trusted():
        return
    check_code(env_id, what="environment")
    obj = _resolve(env_id)
    if not (isinstance(obj, type) and issubclass(obj, TextEnv)):
        raise UntrustedCodeError(
            f"environment {env_id!r} is not a TextEnv class; a config may name only one "
            f"(a factory function is called to find out what it builds); {TRUST_HINT}"
        )


@dataclass(frozen=True)
class EnvRecord:
    """One row of `list_envs()`: what is registered under an id and where it came from.

    `source` is "builtin", the distribution (package) name of the plugin that registered it, or
    "error: <message>" for a plugin that failed to load (then `id` is the plugin's entry-point name).
    """

    id: str
    description: str
    source: str
    entry_point: str | Callable[..., TextEnv] | None = None
    defaults: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, str]:
        """JSON-friendly view used by `agent-runtime envs list --json`."""
        return {"id": self.id, "description": self.description, "source": self.source}


_registry: dict[str, EnvRecord] = {}
_plugin_errors: dict[str, str] = {}
_plugins_loaded = False
_builtins_registered = False
_current_source = BUILTIN


def register(
    id: str,
    entry_point: str | Callable[..., TextEnv],
    *,
    description: str = "",
    **defaults: Any,
) -> None:
    """Register an environment under `id`.

    `entry_point` is a callable returning a TextEnv (usually the class) or a lazy "module:attr" string.
    `defaults` are keyword arguments passed to it, overridden by those given to `make`.
    Raises DuplicateEnvironmentError if the id is taken.
    """
    if not isinstance(id, str) or not id or ":" in id:
        raise ValueError(f"environment id must be a non-empty string without ':', got {id!r}")
    if id in _registry:
        raise DuplicateEnvironmentError(
            f"environment id {id!r} is already registered (by {_registry[id].source}); "
            f"pick another id for the registration from {_current_source}"
        )
    _registry[id] = EnvRecord(id, description, _current_source, entry_point, dict(defaults))


@contextmanager
def _registering_as(source: str) -> Iterator[None]:
    global _current_source
    previous, _current_source = _current_source, source
    try:
        yield
    finally:
        _current_source = previous


def load_plugins() -> None:
    """Load every entry point of the `agent_runtime.environments` group, once per process.

    Each entry point's value is a function that calls `register`. Failures are recorded per plugin
    (see `list_envs`) instead of raised, so one broken plugin never hides the others. A registration
    that collides with an existing id counts as that plugin's failure.
    """
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        source = ep.dist.name if ep.dist is not None else ep.name
        before = set(_registry)
        try:
            with _registering_as(source):
                hook = ep.load()
                hook()
        except Exception as exc:  # noqa: BLE001 - a plugin may fail in any way; report it, keep the others
            for env_id in set(_registry) - before:
                del _registry[env_id]
            _plugin_errors[ep.name] = f"{type(exc).__name__}: {exc}"


def _builtins() -> None:
    """Register the built-in environments (`environments.builtin.BUILTINS`), once per process."""
    global _builtins_registered
    if _builtins_registered:
        return
    from environments.builtin import BUILTINS

    for builtin in BUILTINS:
        register(builtin.id, builtin.entry_point, description=builtin.description, **builtin.defaults)
    _builtins_registered = True


def list_envs() -> list[EnvRecord]:
    """Every registered environment (built-ins, then plugins, sorted by id) plus one record per broken plugin."""
    _builtins()
    load_plugins()
    records = sorted(_registry.values(), key=lambda r: (r.source != BUILTIN, r.id))
    records += [EnvRecord(name, "", f"error: {msg}") for name, msg in sorted(_plugin_errors.items())]
    return records


def _resolve(entry_point: str | Callable[..., TextEnv]) -> Callable[..., TextEnv]:
    if callable(entry_point):
        return entry_point
    module_name, _, attr = entry_point.partition(":")
    if not module_name or not attr:
        raise EnvConstructionError(f"entry point {entry_point!r} must look like 'package.module:ClassName'")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise UnknownEnvironmentError(f"cannot import module {module_name!r} for {entry_point!r}: {exc}") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise UnknownEnvironmentError(f"module {module_name!r} has no attribute {attr!r}") from None
    if not callable(obj):
        raise EnvConstructionError(f"{entry_point!r} is not callable")
    return obj


def _check_kwargs(env_id: str, factory: Callable[..., TextEnv], kwargs: dict[str, Any]) -> None:
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return  # builtins without a signature: let the call itself complain
    params = signature.parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    accepted = [n for n, p in params.items() if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]
    unknown = [k for k in kwargs if k not in accepted]
    if unknown:
        raise EnvConstructionError(
            f"{env_id} does not accept {', '.join(repr(k) for k in unknown)}; "
            f"accepted: {', '.join(accepted) or '(none)'}"
        )


def make(id: str, **kwargs: Any) -> TextEnv:
    """Build the environment registered as `id` (or the class named by "pkg.module:ClassName").

    Keyword arguments override the registered defaults. Raises UnknownEnvironmentError listing the
    known ids, or EnvConstructionError for keyword arguments the environment does not accept.
    """
    _builtins()
    load_plugins()
    if id in _registry:
        record = _registry[id]
        factory = _resolve(record.entry_point)  # type: ignore[arg-type]
        merged = {**record.defaults, **kwargs}
    elif ":" in id:
        factory, merged = _resolve(id), kwargs
    else:
        known = ", ".join(sorted(_registry)) or "(none)"
        hint = f"; broken plugins: {', '.join(sorted(_plugin_errors))}" if _plugin_errors else ""
        raise UnknownEnvironmentError(f"unknown environment {id!r}; known: {known}{hint}")
    _check_kwargs(id, factory, merged)
    env = factory(**merged)
    if not isinstance(env, TextEnv):
        raise EnvConstructionError(f"{id} built a {type(env).__name__}, not a TextEnv")
    return env
