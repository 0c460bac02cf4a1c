"""Config loading: errors name the file, the key and what is accepted; --set overrides any field."""

from __future__ import annotations

import pytest
import yaml

from agent_runtime.config import ConfigError, config_from_dict, load_config, save_resolved


def write(tmp_path, text: str):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def test_unknown_key_names_file_key_and_accepted(tmp_path):
    path = write(tmp_path, "envs: [{id: a}]\nmodel: {temprature: 0.5}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    msg = str(err.value)
    assert str(path) in msg and "model.temprature" in msg and "unknown key" in msg
    assert "temperature" in msg.split("accepted:")[1]


def test_wrong_type_names_key_and_value(tmp_path):
    path = write(tmp_path, "envs: [{id: a}]\nruntime: {slots: many}\n")
    with pytest.raises(ConfigError, match=r"runtime\.slots.*integer.*'many'"):
        load_config(path)


def test_missing_envs_and_bad_backend(tmp_path):
    with pytest.raises(ConfigError, match="envs"):
        load_config(write(tmp_path, "model: {name: x}\n"))
    with pytest.raises(ConfigError, match=r"model\.backend.*'transformers'"):
        load_config(write(tmp_path, "envs: [{id: a}]\nmodel: {backend: tensorflow}\n"))


def test_set_overrides_nested_fields_and_lists(tmp_path):
    path = write(tmp_path, "envs: [{id: a, kwargs: {level: 1}}]\n")
    config = load_config(
        path, ["runtime.slots=4", "model.temperature=0", "envs.0.kwargs.level=3", "model.name=some/model"]
    )
    assert config.name == "c"  # defaults to the file's stem
    assert config.runtime.slots == 4 and config.model.temperature == 0.0
    assert config.envs[0].kwargs == {"level": 3}
    assert config.model.name == "some/model"


def test_set_errors(tmp_path):
    path = write(tmp_path, "envs: [{id: a}]\n")
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        load_config(path, ["runtime.slots"])
    with pytest.raises(ConfigError, match="runtime.slotz"):
        load_config(path, ["runtime.slotz=3"])
    with pytest.raises(ConfigError, match="no such list element"):
        load_config(path, ["envs.5.id=b"])


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write(tmp_path, "envs: [\n"))


def test_resolved_config_round_trips(tmp_path):
    config = load_config(write(tmp_path, "envs: [{id: a}]\n"), ["runtime.episodes=3"])
    out = save_resolved(config, tmp_path / "run")
    again = yaml.safe_load(out.read_text())
    assert again["runtime"]["episodes"] == 3 and again["envs"][0]["id"] == "a"


def test_shipped_configs_validate():
    from pathlib import Path

    shipped = sorted(Path("configs").rglob("*.yaml"))
    assert len(shipped) >= 8
    for path in shipped:
        config = load_config(path)
        assert config.name
    paper = load_config("configs/paper/frozenlake-qwen3-1.7b.yaml")
    assert paper.lessons.pools == 10 and paper.opcd.trainer.k == 256 and paper.envs[0].max_steps == 5


def test_anchor_envs_are_never_the_retention_check_nor_beside_a_separate_teacher(tmp_path):
    th = "{id: textworld/treasure_hunter, kwargs: {level: 1}}"
    config = load_config(write(tmp_path, f"envs: [{{id: a}}]\nopcd: {{anchor_envs: [{th}], anchor_episodes: 4}}\n"))
    assert config.opcd.anchor_envs[0].kwargs == {"level": 1} and config.opcd.anchor_episodes == 4
    with pytest.raises(ConfigError, match="also a retention env"):
        load_config(write(tmp_path, f"envs: [{{id: a}}]\nopcd: {{anchor_envs: [{th}], retention_envs: [{th}]}}\n"))
    with pytest.raises(ConfigError, match="separate teacher|opcd.teacher"):
        load_config(write(tmp_path, f"envs: [{{id: a}}]\nopcd: {{anchor_envs: [{th}], teacher: {{model: b}}}}\n"))


def test_model_options_are_checked_against_the_backend_when_the_config_is_read(tmp_path, monkeypatch):
    """`model.options` is typed per backend: an unknown or ill-typed option is an error at load that names the key
    and what that backend accepts, not a failure when the backend is built."""
    path = write(tmp_path, "envs: [{id: a}]\nmodel: {options: {prefix_cach: false}}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    msg = str(err.value)
    assert str(path) in msg and "model.options: the transformers backend: prefix_cach: unknown option" in msg
    assert "accepted: choice_batch_mb, min_shared_prefix, prefix_cache, prefix_cache_mb, prefix_cache_tokens" in msg
    with pytest.raises(ConfigError, match=r"prefix_cache_tokens: Input should be greater than or equal to 0"):
        load_config(write(tmp_path, "envs: [{id: a}]\nmodel: {options: {prefix_cache_tokens: -1}}\n"))
    with pytest.raises(ConfigError, match=r"the scripted backend: mode: Input should be 'random-admissible'"):
        load_config(write(tmp_path, "envs: [{id: a}]\nmodel: {backend: scripted, options: {mode: fixd}}\n"))
    with pytest.raises(ConfigError, match=r"runtime\.ray: the chat backend: kwarg: unknown option"):
        load_config(
            write(
                tmp_path,
                "envs: [{id: a}]\n"
                "runtime: {executor: ray, ray: {generation: server, server: {class: a:B, kwarg: {}}}}\n",
            )
        )
    # vLLM takes its engine's own arguments beside the ones it names (the interpreter: the user's own vLLM's)
    monkeypatch.setenv("AGENT_RUNTIME_VLLM_PYTHON", "/x/python")
    config = load_config(
        write(tmp_path, "envs: [{id: a}]\nmodel: {backend: vllm, options: {python: /x/python, max_num_seqs: 8}}\n")
    )
    typed = config.model.typed_options()
    assert typed.python == "/x/python" and typed.model_dump()["max_num_seqs"] == 8
    assert typed.choice_trie_above is None, "left out: the backend's own default (written once, in its constructor)"
    chat = load_config(write(tmp_path, "envs: [{id: a}]\nmodel: {backend: chat, options: {class: a:B}}\n"))
    assert chat.model.typed_options().class_ == "a:B" and chat.model.options == {"class": "a:B"}, "stored as given"


def test_a_backend_built_from_a_copied_config_checks_its_options_too():
    """A config changed in code (`model_copy` does not validate) is checked where the backend is built."""
    from agent_runtime.config import ModelConfig
    from agent_runtime.llm import BackendError, make_backend

    model = ModelConfig(name="scripted", backend="scripted").model_copy(update={"options": {"follow": True}})
    with pytest.raises(BackendError, match="model.options: the scripted backend: follow: unknown option"):
        make_backend(model)
    import random

    seeded = ModelConfig(name="scripted", backend="scripted")
    assert make_backend(seeded, seed=7)._rng.getstate() == random.Random(7).getstate(), "the run's seed by default"
    chosen = make_backend(seeded.model_copy(update={"options": {"seed": 3}}), seed=7)
    assert chosen._rng.getstate() == random.Random(3).getstate(), "options.seed when given"


def test_no_shipped_config_lets_a_decision_play_the_held_out_games():
    """Every shipped config's decisions (the gate, the trials of induced lessons, the promotion) play a decision split,
    as it reads and as its run stores it."""
    from pathlib import Path

    from distill.lessons.config import DECISION_SPLITS

    for path in sorted(Path("configs").rglob("*.yaml")):
        config = load_config(path)
        splits = (config.lessons.gate_split, config.lessons.trial_split, config.opcd.validation_split)
        assert set(splits) <= set(DECISION_SPLITS) and "eval" not in splits, path
        stored = config_from_dict(config.model_dump(mode="json"), stored=True)
        assert not stored.lessons.held_out_decisions and not stored.opcd.held_out_decisions, path


def test_a_stored_run_config_with_the_gate_on_eval_loads_only_as_stored():
    data = {"name": "old", "envs": [{"id": "toy/guess"}], "lessons": {"gate_split": "eval"}}
    with pytest.raises(
        ConfigError, match=r"the stored config of run 3: lessons.gate_split: .*accepted: validation, train"
    ):
        config_from_dict(data, source="the stored config of run 3")
    assert config_from_dict(data, stored=True).lessons.held_out_decisions
