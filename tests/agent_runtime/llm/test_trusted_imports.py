"""A module a config may name without `--trust-code` because of its package name (`langchain`, `langchain_*`) is
imported only from an installed distribution: never from the working directory or a script's folder that happens
to hold a file of that name; and `python -m agent_runtime` imports nothing from the working directory at all."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agent_runtime.config import ModelConfig
from agent_runtime.llm import make_backend
from agent_runtime.llm.base import BackendError
from agent_runtime.llm.chat_backend import CHAT_PACKAGES, CHAT_PREFIXES
from environments.registry import TRUST_ENV, check_code
from tests import ROOT

REPO = ROOT


@pytest.fixture(autouse=True)
def untrusted(monkeypatch):
    monkeypatch.setenv(TRUST_ENV, "0")


def plant(folder: Path, name: str, body: str = "") -> Path:
    """`folder/name.py`, which touches `folder/name.imported` when it is imported; returns that marker."""
    marker = folder / f"{name}.imported"
    (folder / f"{name}.py").write_text(f"from pathlib import Path\nPath({str(marker)!r}).touch()\n{body}")
    return marker


def run_in(folder: Path, model: dict) -> subprocess.CompletedProcess[str]:
    """`python -m agent_runtime run` of a one-episode config with this `model` section, started in `folder`."""
    config = {
        "name": "t",
        "model": model,
        "envs": [{"id": "environments.testing:GuessEnv", "max_steps": 3}],
        "runtime": {"episodes": 1},
        "memory": {"embedder": "hash"},
    }
    (folder / "c.yaml").write_text(yaml.safe_dump(config))
    return subprocess.run(
        [sys.executable, "-m", "agent_runtime", "run", "c.yaml", "--workdir", "w", "--no-progress"],
        check=False,
        cwd=folder,
        env={**os.environ, TRUST_ENV: "0"},
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_python_m_imports_no_langchain_module_from_the_working_directory(tmp_path):
    """What the review found: `python -m agent_runtime run` with a `langchain_evil.py` in the current directory
    ran it before the class check (the prefix rule trusted any module of that name)."""
    evil = plant(tmp_path, "langchain_evil", "class Chat:\n    pass\n")
    proc = run_in(tmp_path, {"name": "x", "backend": "chat", "options": {"class": "langchain_evil:Chat"}})
    assert not evil.exists(), "the working directory's langchain_evil.py ran"
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "'langchain_evil:Chat'" in proc.stderr and "No module named 'langchain_evil'" in proc.stderr


@pytest.mark.slow
def test_python_m_imports_nothing_the_runtime_uses_from_the_working_directory(tmp_path):
    shadow = plant(tmp_path, "yaml")  # the runtime reads its config with it
    proc = run_in(tmp_path, {"name": "scripted", "backend": "scripted"})
    assert not shadow.exists(), "the working directory's yaml.py ran"
    assert proc.returncode == 0, proc.stderr


def chat_check(spec: str) -> None:
    check_code(spec, what="chat model", packages=CHAT_PACKAGES, prefixes=CHAT_PREFIXES)


def test_a_langchain_named_module_outside_every_installed_distribution_is_refused(tmp_path, monkeypatch):
    """A script's folder, or any other path entry, holding `langchain_planted.py`: refused without the opt-in."""
    monkeypatch.syspath_prepend(str(tmp_path))
    marker = plant(tmp_path, "langchain_planted", "class Chat:\n    pass\n")
    monkeypatch.delitem(sys.modules, "langchain_planted", raising=False)
    with pytest.raises(BackendError) as err:
        make_backend(ModelConfig(name="x", backend="chat", options={"class": "langchain_planted:Chat"}))
    assert not marker.exists(), "the module ran"
    message = str(err.value)
    assert "refusing to import module 'langchain_planted'" in message and "--trust-code" in message
    assert str(tmp_path / "langchain_planted.py") in message and "no installed distribution" in message


def test_an_installed_langchain_package_needs_no_opt_in():
    chat_check("langchain_openai.not_imported_yet:ChatOpenAI")  # the installed distribution langchain-openai
    chat_check("langchain_core.not_imported_yet:Model")
