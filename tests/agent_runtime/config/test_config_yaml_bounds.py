"""YAML the runtime is handed (a config file, a `--set` value) cannot grow past what was written: a document whose
aliases repeat more than 10,000 nodes ("billion laughs"), that refers to itself, or that nests past 100 levels is
refused while it is read, at once, with a message that says what was found and what is accepted; a config with
a few ordinary aliases loads as before."""

from __future__ import annotations

import time
from itertools import pairwise

import pytest

from agent_runtime.bounded_yaml import MAX_ALIAS_NODES, YAMLLimitError, load_yaml
from agent_runtime.config import ConfigError, load_config

BASE = "envs:\n  - id: textworld/coin_collector\n    kwargs:\n      payload: *i\n"


def laughs(levels: int = 9, flow: bool = False) -> str:
    """Nine aliases of the level below on each of `levels` levels: under 500 bytes, 9**levels nodes expanded."""
    names = "abcdefghijklmnop"[:levels]
    rows = [f"{names[0]}: &{names[0]} [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    rows += [f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]" for p, n in pairwise(names)]
    return "{" + ", ".join(rows) + "}" if flow else "\n".join(rows) + "\n"


def test_a_billion_laughs_config_is_refused_at_once(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(laughs() + BASE)
    assert len(path.read_bytes()) < 600
    started = time.perf_counter()
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert time.perf_counter() - started < 2.0
    message = str(err.value)
    assert str(path) in message and f"aliases repeat more than {MAX_ALIAS_NODES:,} nodes" in message
    assert "*d, line 5" in message, "it names where the limit was passed"


def test_a_billion_laughs_set_value_is_refused_by_the_cli(tmp_path, cli):
    """`run --dry-run --set` with a bomb as the value: exit 2 and one clear line, no traceback, in well under a
    second's worth of work (it cost 1.3 GB before)."""
    config = tmp_path / "c.yaml"
    config.write_text("model: {name: scripted, backend: scripted}\nenvs: [{id: environments.testing:GuessEnv}]\n")
    started = time.perf_counter()
    proc = cli(
        "run",
        config,
        "--dry-run",
        "--workdir",
        tmp_path / "w",
        "--set",
        f"envs.0.kwargs={laughs(flow=True)}",
        check=False,
    )
    assert time.perf_counter() - started < 2.0
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "--set envs.0.kwargs" in proc.stderr and "aliases repeat more than" in proc.stderr


def test_a_config_with_a_few_aliases_still_loads(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        "envs:\n"
        "  - &coin {id: textworld/coin_collector, kwargs: &kw {level: 1, n_train: 4}}\n"
        "  - {id: textworld/treasure_hunter, weight: 2, kwargs: {<<: *kw, level: 2}}\n"
        "opcd: {retention_envs: [*coin]}\n"
    )
    config = load_config(path)
    assert [e.kwargs for e in config.envs] == [{"level": 1, "n_train": 4}, {"level": 2, "n_train": 4}]
    assert config.opcd.retention_envs[0].kwargs == {"level": 1, "n_train": 4}


def test_aliases_up_to_the_limit_load_and_one_node_more_is_refused():
    block = "a: &a [" + ", ".join(["x"] * 99) + "]\n"  # 100 nodes with the sequence itself
    fits = block + "b: [" + ", ".join(["*a"] * (MAX_ALIAS_NODES // 100)) + "]\n"
    assert len(load_yaml(fits)["b"]) == MAX_ALIAS_NODES // 100
    with pytest.raises(YAMLLimitError, match="aliases repeat more than"):
        load_yaml(fits.replace("b: [", "b: [*a, "))


def test_a_recursive_document_and_deep_nesting_are_refused(tmp_path):
    with pytest.raises(YAMLLimitError, match=r"alias \*a at line 1.*inside the node its anchor names"):
        load_yaml("a: &a [1, *a]\n")
    path = tmp_path / "deep.yaml"
    path.write_text("envs: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ConfigError, match=r"deep\.yaml: the document nests deeper than 100 levels"):
        load_config(path)
    path.write_text("envs: [{id: textworld/coin_collector}]\n")
    with pytest.raises(ConfigError, match=r"--set model.options: the document nests deeper"):
        load_config(path, ["model.options=" + "{a: " * 200 + "1" + "}" * 200])


def test_python_tags_are_still_refused(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("envs: !!python/object/apply:os.system [touch pwned]\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(path)
    assert not (tmp_path / "pwned").exists()
