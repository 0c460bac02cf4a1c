"""Hardening of what a config and a workdir can make the runtime do: a config imports no module it names
unless that runs nothing unasked (or `--trust-code`); a resumed run's name and stored config must agree, and
the stored config may not redirect what runs, what is read or where the run writes; a run name is never a
path; the runtime never writes through a symbolic link; the dashboard's token redirect stays on the
dashboard."""

from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from fastapi.testclient import TestClient

from agent_runtime.cli import main
from agent_runtime.config import ConfigError, ModelConfig, UnsafePathError, config_from_dict, save_resolved
from agent_runtime.dashboard.app import _local_path, create_app
from agent_runtime.episode.build import build_envs
from agent_runtime.llm import make_backend
from agent_runtime.llm.base import BackendError
from agent_runtime.run.loop import AgentLoop
from environments.registry import TRUST_ENV, UntrustedCodeError, trusting_code
from memory import ExperienceStore

GUESS = "environments.testing:GuessEnv"


@pytest.fixture(autouse=True)
def untrusted(monkeypatch):
    """No opt-in from the environment, and none left behind."""
    monkeypatch.setenv(TRUST_ENV, "0")


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """`planted(name, body)`: a module on the path that touches a marker file when it is imported; returns
    the marker."""
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))

    def plant(name: str, body: str = "") -> Path:
        marker = tmp_path / f"{name}.imported"
        (site / f"{name}.py").write_text(
            f"from pathlib import Path\nPath({str(marker)!r}).touch()\n" + textwrap.dedent(body)
        )
        monkeypatch.delitem(sys.modules, name, raising=False)
        return marker

    return plant


def cfg(name: str = "t", **extra) -> dict:
    return {
        "name": name,
        "model": {"name": "scripted", "backend": "scripted"},
        "envs": [{"id": GUESS, "max_steps": 3}],
        "runtime": {"episodes": 1},
        "memory": {"embedder": "hash"},
        **extra,
    }


def write_yaml(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


# A. a config's code is imported only when that runs nothing unasked --------------------------------------------
def test_a_chat_class_outside_the_allowed_packages_is_not_imported(planted, capsys):
    assert "this" not in sys.modules
    with pytest.raises(BackendError, match=r"refusing to import module 'this'.*--trust-code"):
        make_backend(ModelConfig(name="x", backend="chat", options={"class": "this:X"}))
    assert "this" not in sys.modules and "Zen of Python" not in capsys.readouterr().out
    marker = planted("planted_chat", "class Model:\n    pass\n")
    with pytest.raises(BackendError, match="refusing to import module 'planted_chat'"):
        make_backend(ModelConfig(name="x", backend="chat", options={"class": "planted_chat:Model"}))
    assert not marker.exists(), "the module ran"
    with trusting_code(), pytest.raises(BackendError, match="is not a langchain-core BaseChatModel"):
        make_backend(ModelConfig(name="x", backend="chat", options={"class": "planted_chat:Model"}))
    assert marker.exists(), "the opt-in imports it"


def test_run_refuses_a_planted_chat_class_and_trust_code_allows_it(tmp_path, planted, capsys):
    marker = planted("planted_run_chat", "class Model:\n    pass\n")
    config = write_yaml(
        tmp_path / "c.yaml", cfg(model={"name": "x", "backend": "chat", "options": {"class": "planted_run_chat:Model"}})
    )
    assert main(["run", str(config), "--workdir", str(tmp_path / "w"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "refusing to import module 'planted_run_chat'" in err and "--trust-code" in err
    assert not marker.exists()
    assert main(["run", str(config), "--workdir", str(tmp_path / "w2"), "--no-progress", "--trust-code"]) == 2
    assert "is not a langchain-core BaseChatModel" in capsys.readouterr().err and marker.exists()
    import os

    assert os.environ[TRUST_ENV] == "0", "the opt-in lasts the command only"


def test_a_config_env_id_in_a_planted_module_is_not_imported(tmp_path, planted):
    marker = planted("planted_env", "from environments.testing import GuessEnv\nclass Env(GuessEnv):\n    pass\n")
    config = config_from_dict(cfg(envs=[{"id": "planted_env:Env"}]))
    with pytest.raises(UntrustedCodeError, match=r"environment 'planted_env:Env': refusing.*--trust-code"):
        build_envs(config, tmp_path)
    assert not marker.exists(), "the module ran"
    with trusting_code():
        specs, _ = build_envs(config, tmp_path)
    assert marker.exists() and specs[0].env_id == "planted_env:Env"


def test_a_config_env_id_must_name_an_environment_class(tmp_path):
    """`subprocess` is imported already (so looking it up runs nothing), but Popen is no environment: it is
    refused before it is called."""
    config = config_from_dict(cfg(envs=[{"id": "subprocess:Popen", "kwargs": {"args": ["true"]}}]))
    with pytest.raises(UntrustedCodeError, match="'subprocess:Popen' is not a TextEnv class"):
        build_envs(config, tmp_path)


def test_the_project_own_modules_need_no_opt_in(tmp_path):
    specs, _ = build_envs(
        config_from_dict(cfg(envs=[{"id": GUESS}, {"id": "tests.agent_runtime.run.test_loop:LessonSensitiveEnv"}])),
        tmp_path,
    )
    assert [s.env_id for s in specs] == [GUESS, "tests.agent_runtime.run.test_loop:LessonSensitiveEnv"]


# B. the run's name and its stored config ----------------------------------------------------------------------
def test_resume_refuses_a_run_whose_stored_config_names_another_run(tmp_path):
    with ExperienceStore.open(tmp_path) as store:
        first = store.create_run("smoke", config_from_dict(cfg("smoke")).model_dump(mode="json"))
        second = store.create_run("smoke2", config_from_dict(cfg("smoke")).model_dump(mode="json"))
    assert (first, second) == (1, 2)
    with pytest.raises(
        ConfigError,
        match=r"run 2 in .* is named 'smoke2', but its stored config names the run "
        r"'smoke'.*Start a new run",
    ):
        AgentLoop(config_from_dict(cfg("smoke2")), tmp_path, resume=True, progress=False)


def test_resume_of_a_run_whose_stored_name_has_no_run_is_a_clear_error(tmp_path):
    with ExperienceStore.open(tmp_path) as store:
        store.create_run("smoke2", config_from_dict(cfg("ghost")).model_dump(mode="json"))
    with pytest.raises(ConfigError, match="stored config names the run 'ghost'"):
        AgentLoop(config_from_dict(cfg("smoke2")), tmp_path, resume=True, progress=False)


# C. a resumed run takes nothing that redirects its effects ------------------------------------------------------
GUARDED = {
    "memory.url": {"memory": {"embedder": "hash", "url": "sqlite:///elsewhere.db"}},
    "memory.embedder": {"memory": {"embedder": "hash:16"}},
    "model.name": {"model": {"name": "other", "backend": "scripted"}},
    "model.adapter": {"model": {"name": "scripted", "backend": "scripted", "adapter": "/tmp/planted-adapter"}},
    "model.options.trust_remote_code": {
        "model": {"name": "scripted", "backend": "vllm", "options": {"trust_remote_code": True}}
    },
    "model.options.worker_extension_cls": {
        "model": {"name": "scripted", "backend": "vllm", "options": {"worker_extension_cls": "evil:Ext"}}
    },
    "model.options.logits_processors": {
        "model": {"name": "scripted", "backend": "vllm", "options": {"logits_processors": ["evil:Proc"]}}
    },
    "opcd.context.file": {"opcd": {"context": {"file": "/etc/hostname"}}},
    "envs.0.kwargs.cache_dir": {"envs": [{"id": GUESS, "max_steps": 3, "kwargs": {"cache_dir": "/tmp/planted"}}]},
}


@pytest.mark.parametrize("field", sorted(GUARDED))
def test_resume_refuses_a_stored_config_that_redirects_the_run(tmp_path, field):
    with trusting_code():  # vLLM's engine arguments here are given only under --trust-code; refused even then
        with ExperienceStore.open(tmp_path) as store:
            store.create_run("t", config_from_dict(cfg(**GUARDED[field])).model_dump(mode="json"))
        with pytest.raises(
            ConfigError, match=rf"differ in fields that decide what runs(.|\n)*  {re.escape(field)}[.\d]*: stored "
        ):
            AgentLoop(config_from_dict(cfg()), tmp_path, resume=True, progress=False)


def test_resume_lists_harmless_differences_and_goes_on(tmp_path, capsys):
    with ExperienceStore.open(tmp_path) as store:
        run_id = store.create_run("t", config_from_dict(cfg(lessons={"extract_every": 5})).model_dump(mode="json"))
    given = cfg(lessons={"extract_every": 7}, runtime={"episodes": 3})
    loop = AgentLoop(config_from_dict(given), tmp_path, resume=True, progress=False)
    try:
        assert loop.run_id == run_id and loop.config.lessons.extract_every == 5 and loop.config.runtime.episodes == 3
    finally:
        loop.close()
    err = capsys.readouterr().err
    assert "lessons.extract_every: stored 5, given 7 (the stored value is kept)" in err
    assert "runtime.episodes: stored 1, given 3\n" in err + "\n"


def test_run_resume_with_a_redirecting_difference_exits_2(tmp_path, capsys):
    with ExperienceStore.open(tmp_path / "w") as store:
        store.create_run("t", config_from_dict(cfg(memory={"embedder": "hash:16"})).model_dump(mode="json"))
    config = write_yaml(tmp_path / "t.yaml", cfg())
    assert main(["run", str(config), "--workdir", str(tmp_path / "w"), "--resume", "--no-progress"]) == 2
    assert "memory.embedder: stored 'hash:16', given 'hash'" in capsys.readouterr().err


# D. names and paths ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", [".", "..", ".hidden", "a/b", "..\\x", "/abs"])
def test_a_run_name_is_never_a_path(name):
    with pytest.raises(ConfigError, match="name"):
        config_from_dict(cfg(name))


@pytest.mark.parametrize("name", ["smoke", "run.2", "a-b_c", "v1..2"])
def test_ordinary_run_names_are_accepted(name):
    assert config_from_dict(cfg(name)).name == name


def test_run_set_name_dotdot_writes_nothing_in_the_current_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write_yaml(tmp_path / "c.yaml", cfg())
    assert main(["run", "c.yaml", "--set", "name=..", "--no-progress"]) == 2
    assert "name" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml"]


def test_a_symlinked_resolved_config_is_not_written_through(tmp_path):
    target = tmp_path / "target.txt"
    target.write_text("keep")
    workdir = tmp_path / "w"
    workdir.mkdir()
    (workdir / "config.resolved.yaml").symlink_to(target)
    with pytest.raises(UnsafePathError, match="config.resolved.yaml is a symbolic link"):
        save_resolved(config_from_dict(cfg()), workdir)
    assert target.read_text() == "keep"
    with pytest.raises(UnsafePathError):
        AgentLoop(config_from_dict(cfg()), workdir, progress=False)
    assert target.read_text() == "keep"


def test_a_symlinked_run_log_is_not_appended_to(tmp_path, capsys):
    target = tmp_path / "target.txt"
    target.write_text("keep")
    workdir = tmp_path / "w"
    workdir.mkdir()
    (workdir / "run.log.jsonl").symlink_to(target)
    config = write_yaml(tmp_path / "t.yaml", cfg())
    assert main(["run", str(config), "--workdir", str(workdir), "--no-progress"]) == 2
    assert "run.log.jsonl is a symbolic link" in capsys.readouterr().err
    assert target.read_text() == "keep"


def test_the_run_log_is_still_written(tmp_path):
    loop = AgentLoop(config_from_dict(cfg()), tmp_path, progress=False)
    loop.run()
    loop.close()
    assert '"summary"' in (tmp_path / "run.log.jsonl").read_text()
    assert yaml.safe_load((tmp_path / "config.resolved.yaml").read_text())["name"] == "t"


# E. the dashboard's token redirect ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("path", "location"),
    [
        ("//evil.example/x", "/evil.example/x"),
        ("///evil.example/x", "/evil.example/x"),
        ("/episodes", "/episodes"),
    ],
)
def test_the_token_redirect_stays_on_the_dashboard(tmp_path, path, location):
    ExperienceStore.open(tmp_path).close()
    with TestClient(
        create_app(tmp_path, token="T"), base_url="http://127.0.0.1:8765", follow_redirects=False
    ) as client:
        answer = client.get(f"http://127.0.0.1:8765{path}?token=T&page=2")
    assert answer.status_code == 303
    assert answer.headers["location"] == f"{location}?page=2"


@pytest.mark.parametrize(
    ("path", "location"),
    [
        ("//evil.example/x", "/evil.example/x"),
        ("/\\evil.example/x", "/%5Cevil.example/x"),  # browsers read a backslash as a slash
        ("/\t/evil.example", "/%09/evil.example"),  # and drop tabs and newlines
        ("/\n//evil.example", "/%0A//evil.example"),
        ("/http://evil.example", "/http://evil.example"),  # a path of the dashboard, not a URL
        ("/runs/1/episodes", "/runs/1/episodes"),
    ],
)
def test_the_redirect_target_is_a_dashboard_path(path, location):
    """What the server was asked for (the path as decoded; a client may normalise some of these away)."""
    assert _local_path(path) == location


def test_a_workdirs_memory_db_that_is_a_symlink_is_refused(tmp_path) -> None:
    from memory import ExperienceStore
    from memory.errors import StoreUnavailableError

    elsewhere = tmp_path / "elsewhere.db"
    with ExperienceStore.open(elsewhere) as store:
        store.create_run("theirs", {})
    before = elsewhere.read_bytes()
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "memory.db").symlink_to(elsewhere)
    with pytest.raises(StoreUnavailableError, match="symbolic link"):
        ExperienceStore.open(workdir)
    assert elsewhere.read_bytes() == before
    with ExperienceStore.open(workdir / "memory.db", read_only=True) as store:  # named directly: the user's choice
        assert store.find_run("theirs") is not None
