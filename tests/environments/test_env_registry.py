"""Registry and plugins: unknown ids, kwarg checking, duplicates, "module:Class" ids, entry-point discovery."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import environments
from environments import registry
from environments.testing import GuessEnv
from tests import ROOT

REPO = ROOT


@pytest.fixture
def clean_registry(monkeypatch):
    """Registrations made by a test vanish afterwards."""
    environments.list_envs()  # built-ins and plugins in place first
    monkeypatch.setattr(registry, "_registry", dict(registry._registry))


def test_unknown_id_lists_known_ids():
    with pytest.raises(environments.UnknownEnvironmentError) as err:
        environments.make("textworld/coin_colector")
    message = str(err.value)
    assert "unknown environment 'textworld/coin_colector'" in message
    assert "textworld/coin_collector" in message and "math/gsm_symbolic" in message


def test_unknown_kwarg_is_a_clear_error():
    with pytest.raises(environments.EnvConstructionError, match="does not accept 'levle'; accepted: level"):
        environments.make("textworld/coin_collector", levle=3)


def test_builtins_accept_uniform_kwargs(tmp_path):
    env = environments.make("textarena/frozenlake", max_steps=3, cache_dir=str(tmp_path))
    assert env.spec.max_steps == 3 and env.spec.family == "arena"


def test_list_envs_records_builtins():
    records = {r.id: r for r in environments.list_envs()}
    expected = {
        "textworld/coin_collector",
        "textworld/treasure_hunter",
        "textworld/cooking",
        "textworld/simple",
        "textworld/custom",
        "alfworld/text",
        "math/gsm8k",
        "math/math",
        "math/dapo",
        "math/gsm_symbolic",
        "math/champ",
        "textarena/frozenlake",
        "textarena/sokoban",
    }
    assert expected <= set(records)
    assert all(records[i].source == "builtin" and records[i].description for i in expected)
    assert records["math/champ"].as_dict() == {
        "id": "math/champ",
        "description": records["math/champ"].description,
        "source": "builtin",
    }


def test_duplicate_id_is_an_error(clean_registry):
    environments.register("test/guess", GuessEnv)
    with pytest.raises(environments.DuplicateEnvironmentError, match="already registered"):
        environments.register("test/guess", GuessEnv)
    with pytest.raises(environments.DuplicateEnvironmentError):
        environments.register("textworld/coin_collector", GuessEnv)


def test_register_callable_with_defaults(clean_registry):
    environments.register("test/guess-short", GuessEnv, description="short", max_steps=2)
    env = environments.make("test/guess-short")
    assert env.spec.max_steps == 2
    assert environments.make("test/guess-short", max_steps=3).spec.max_steps == 3


def test_make_module_colon_class(tmp_path, monkeypatch):
    (tmp_path / "unpublished_env.py").write_text(
        textwrap.dedent("""
        from environments.testing import GuessEnv
        class Mine(GuessEnv):
            pass
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    env = environments.make("unpublished_env:Mine", max_steps=2)
    assert type(env).__name__ == "Mine" and env.spec.max_steps == 2
    with pytest.raises(environments.UnknownEnvironmentError, match="no attribute 'Nope'"):
        environments.make("unpublished_env:Nope")
    with pytest.raises(environments.UnknownEnvironmentError, match="cannot import module"):
        environments.make("no_such_module_xyz:Env")


def _write_plugin(site: Path, dist: str, module: str, body: str) -> None:
    (site / f"{module}.py").write_text(textwrap.dedent(body))
    info = site / f"{dist}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[agent_runtime.environments]\n{dist} = {module}:register_all\n")


def test_plugin_discovered_through_entry_point(tmp_path):
    """A package on the path with an entry point is found lazily; a broken one is reported by name."""
    _write_plugin(
        tmp_path,
        "good-plugin",
        "good_plugin",
        """
        import environments
        from environments.testing import GuessEnv
        def register_all():
            environments.register("good/guess", GuessEnv, description="a plugin game")
    """,
    )
    _write_plugin(
        tmp_path,
        "broken-plugin",
        "broken_plugin",
        """
        def register_all():
            raise RuntimeError("boom at registration")
    """,
    )
    _write_plugin(
        tmp_path,
        "greedy-plugin",
        "greedy_plugin",
        """
        import environments
        from environments.testing import GuessEnv
        def register_all():
            environments.register("greedy/ok", GuessEnv)
            environments.register("textworld/coin_collector", GuessEnv)
    """,
    )
    script = textwrap.dedent("""
        import json, sys
        import environments
        lazy = "good_plugin" not in sys.modules
        records = [r.as_dict() for r in environments.list_envs()]
        env = environments.make("good/guess")
        failures = environments.cli_check("good/guess", episodes=2)
        print(json.dumps({"lazy": lazy, "records": records, "failures": failures, "type": type(env).__name__}))
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    records = {r["id"]: r for r in result["records"]}
    assert result["lazy"] is True
    assert records["good/guess"]["source"] == "good-plugin"
    assert records["good/guess"]["description"] == "a plugin game"
    assert records["broken-plugin"]["source"] == "error: RuntimeError: boom at registration"
    assert "already registered" in records["greedy-plugin"]["source"]
    assert "greedy/ok" not in records  # a failed plugin leaves no half registration behind
    assert records["textworld/coin_collector"]["source"] == "builtin"
    assert result["failures"] == [] and result["type"] == "GuessEnv"


def test_docs_example_environment_conforms(tmp_path, monkeypatch, clean_registry):
    """The complete example in docs/environments.md works as printed."""
    doc = (REPO / "docs" / "environments.md").read_text()
    code = doc.split("`guess_env/__init__.py`:", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    package = tmp_path / "guess_env"
    package.mkdir()
    (package / "__init__.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert environments.cli_check("guess_env:GuessEnv", episodes=2) == []
    import guess_env

    guess_env.register()
    records = {r.id: r for r in environments.list_envs()}
    assert records["guess/number-hard"].description == "Guess a number up to 100"
    env = environments.make("guess/number-hard")
    environments.check_env(env)
    assert env.high == 100


@pytest.mark.parametrize(
    "env_id",
    [
        "math/gsm8k",
        "math/math",
        "math/dapo",
        "math/champ",
        "math/gsm_symbolic",
        "textarena/sokoban",
        "alfworld/text",
        "textworld/custom",
    ],
)
def test_every_builtin_rejects_unknown_kwargs(env_id):
    with pytest.raises(environments.EnvConstructionError, match="does not accept 'bogus'"):
        environments.make(env_id, bogus=1)
