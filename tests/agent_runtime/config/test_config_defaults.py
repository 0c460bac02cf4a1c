"""The run config has one set of defaults: a snapshot of `RunConfig()`'s, and no partial override that moves
another field (the old `opcd.trainer` section rebuilt itself from the trainer's paper defaults when one of its
fields was set: lr, LoRA rank and response length changed behind the user's back)."""

from __future__ import annotations

import json

import pytest

from agent_runtime.config import ConfigError, RunConfig, apply_overrides, config_from_dict, load_config
from tests import ROOT, TESTS

SNAPSHOT = TESTS / "data" / "run_config_defaults.json"
MINIMAL = {"name": "t", "envs": [{"id": "math/gsm_symbolic"}]}


def defaults() -> dict:
    return config_from_dict(dict(MINIMAL)).model_dump(mode="json")


def leaves(data, prefix=""):
    if isinstance(data, dict):
        for key, value in data.items():
            yield from leaves(value, f"{prefix}{key}.")
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield from leaves(value, f"{prefix}{i}.")
    else:
        yield prefix[:-1], data


def test_defaults_match_the_snapshot():
    """A changed default is a decision: update tests/data/run_config_defaults.json with it, on purpose."""
    assert defaults() == json.loads(SNAPSHOT.read_text())


def changed(value) -> list:
    """Other values for a default, to try in turn until one is in the field's range (and its other fields')."""
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [value + 1, value - 1]
    if isinstance(value, float):
        return [value / 2, (value + 1) / 2, value * 2] if value else [0.5]
    return []


@pytest.mark.parametrize("path", [p for p, v in leaves(defaults()) if changed(v) and p != "seed"])
def test_a_partial_override_changes_that_field_only(path):
    before = dict(leaves(defaults()))
    for value in changed(before[path]):
        try:
            config = config_from_dict(apply_overrides(dict(MINIMAL), [f"{path}={value}"]))
            break
        except ConfigError:
            continue
    else:
        pytest.fail(f"no other value of {path} validates (tried {changed(before[path])}): add one to changed()")
    after = dict(leaves(config.model_dump(mode="json")))
    assert {k for k in before if before[k] != after.get(k)} == {path}


def test_smoke_config_keeps_the_cycle_trainer_defaults_under_a_partial_override():
    config = load_config(ROOT / "configs" / "smoke.yaml", ["opcd.trainer.steps=50"])
    trainer = config.opcd.trainer
    assert (trainer.steps, trainer.lr, trainer.lora_r, trainer.max_new_tokens) == (50, 1e-4, 8, 32)


def test_the_snapshot_is_a_whole_run_config():
    assert (
        RunConfig.model_validate({**json.loads(SNAPSHOT.read_text()), **MINIMAL}).model_dump(mode="json") == defaults()
    )
