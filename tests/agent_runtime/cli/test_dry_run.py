"""`agent-runtime run --dry-run CONFIG`: every shipped config validates and says what it would
load and train without loading a weight; a config the run would refuse exits 2 with the reason; the starting
adapter comes from the workdir's store when one exists; nothing is written."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from agent_runtime.cli import main
from tests import ROOT

SHIPPED = sorted([*ROOT.glob("configs/*.yaml"), *ROOT.glob("configs/paper/*.yaml")])


@pytest.fixture
def no_weights(monkeypatch):
    """Fail the test if anything reads model weights or converts the embedded model."""
    import transformers

    from agent_runtime import checkpoints

    def refuse(*args, **kwargs):
        raise AssertionError("a dry run loaded model weights")

    for cls in (transformers.AutoModelForCausalLM, transformers.PreTrainedModel):
        monkeypatch.setattr(cls, "from_pretrained", refuse)
    monkeypatch.setattr(checkpoints, "ensure_alias_checkpoint", refuse)


def test_the_shipped_configs_include_the_paper_set_ups():
    names = {p.name for p in SHIPPED}
    assert {
        "frozenlake-qwen3-1.7b-teacher-qwen3-8b.yaml",
        "sysprompt-medmcqa-qwen2.5-7b.yaml",
        "sysprompt-safety-qwen2.5-7b.yaml",
        "quickstart.yaml",
    } <= names and len(SHIPPED) >= 11
    for path in ROOT.glob("configs/paper/*.yaml"):
        assert _reproduction_claim(path.read_text().split("\nname:")[0]), path.name


def _reproduction_claim(header: str) -> bool:
    """A paper config names the paper and the result it reproduces, then either the paper's table with its number
    ("Table 3 ... 41.2") or an explicit statement that neither was found, saying what was searched."""
    claim = header.partition("Reproduces:")[2]
    found = re.search(r"\bTable \d+\b.*?\b\d+(\.\d+)?\b", claim, re.DOTALL) is not None and "NOT FOUND" not in claim
    searched = "table and number: NOT FOUND" in claim and re.search(r"Searched: \S", claim) is not None
    return "arXiv 2602.12275" in header and bool(claim.strip()) and (found or searched)


@pytest.mark.parametrize("path", SHIPPED, ids=[p.relative_to(ROOT).as_posix() for p in SHIPPED])
def test_dry_run_validates_every_shipped_config(path, tmp_path, capsys, no_weights):
    config = yaml.safe_load(path.read_text())
    workdir = tmp_path / "w"
    assert main(["run", "--dry-run", str(path), "--workdir", str(workdir)]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith("ok: the config is valid and the run would start")
    assert (
        f"model       {config['model']['name']}" in out
        and f"backend {config['model'].get('backend', 'transformers')}" in out
    )
    for env in config["envs"]:
        assert f"env         {env['id']} (play" in out
        for key, value in env.get("kwargs", {}).items():  # data files the config says how to fetch
            if (key == "path" or key.endswith("_path")) and not Path(value).exists():
                assert f"note        {env['id']}: {key} {value} is not on this machine" in out
    assert "teacher     " in out and "starts from the base model" in out
    teacher = config.get("opcd", {}).get("teacher")
    if teacher:
        assert f"teacher     {teacher['model']} ->" in out
    if config.get("opcd", {}).get("context"):
        assert "distils a system prompt" in out
    assert not workdir.exists()  # nothing written


def _config(tmp_path, **fields) -> Path:
    data = {"name": "dry", "envs": [{"id": "math/gsm_symbolic"}], **fields}
    path = tmp_path / "dry.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_config_the_run_would_refuse_exits_2_naming_each_problem(tmp_path, capsys, no_weights):
    path = _config(
        tmp_path,
        model={"name": "scripted", "backend": "scripted"},
        envs=[{"id": "math/gsm_symbolic"}, {"id": "no/such-env"}],
        lessons={"enabled": True},
        opcd={"enabled": True},
    )
    assert main(["run", "--dry-run", str(path), "--workdir", str(tmp_path / "w")]) == 2
    out = capsys.readouterr().out
    assert (
        "PROBLEM     opcd.enabled: consolidation trains the policy's own weights (model.name), which needs "
        "backend: transformers or vllm (got scripted)"
    ) in out
    assert "PROBLEM     environment 'no/such-env' is not registered; known: " in out
    assert out.rstrip().endswith("2 problem(s): the run would not start")


def test_the_teacher_vocabulary_is_checked_when_both_tokenizers_are_here(tmp_path, tiny_model_dir, capsys, no_weights):
    from agent_runtime.testing import tiny_tokenizer

    same = _config(tmp_path, model={"name": str(tiny_model_dir)}, opcd={"teacher": {"model": str(tiny_model_dir)}})
    assert main(["run", "--dry-run", str(same), "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["teacher"]["separate"] and found["teacher"]["vocabulary"]["same"]
    assert found["teacher"]["vocabulary"]["student_tokens"] == 512 and found["problems"] == []

    other = tmp_path / "other"
    tiny_tokenizer(vocab_size=300).save_pretrained(other)  # a tokenizer is all a dry run reads
    (other / "config.json").write_text("{}")
    bad = _config(tmp_path, model={"name": str(tiny_model_dir)}, opcd={"teacher": {"model": str(other)}})
    assert main(["run", "--dry-run", str(bad)]) == 2
    out = capsys.readouterr().out
    assert "vocabulary DIFFERENT from the student's" in out
    assert "PROBLEM     opcd.teacher.model: does not share the student's tokenizer: vocabulary: 512 tokens" in out


def test_the_starting_adapter_comes_from_the_workdirs_store(tmp_path, capsys, no_weights):
    from memory import ExperienceStore

    path = _config(tmp_path)
    workdir = tmp_path / "w"
    with ExperienceStore.open(workdir) as store:
        run = store.create_run("dry", {})
        store.add_adapter("cycle-3", "/adapters/cycle-3", run_id=run, status="active")
    assert main(["run", "--dry-run", str(path), "--workdir", str(workdir), "--resume"]) == 0
    assert "starts from adapter cycle-3 (/adapters/cycle-3), continuing run 1" in capsys.readouterr().out
    assert main(["run", "--dry-run", str(path), "--workdir", str(workdir)]) == 0  # it has not played: continued
    assert "starts from adapter cycle-3 (/adapters/cycle-3), continuing run 1" in capsys.readouterr().out


def test_dry_run_through_the_cli_prints_json_and_writes_nothing(tmp_path, cli):
    paper = ROOT / "configs" / "paper" / "frozenlake-qwen3-1.7b-teacher-qwen3-8b.yaml"
    found = json.loads(cli("run", paper, "--dry-run", "--json", "--workdir", tmp_path / "w", cwd=ROOT).stdout)
    assert found["model"]["name"] == "Qwen/Qwen3-1.7B" and found["model"]["device"] == "cuda"
    assert found["teacher"]["name"] == "Qwen/Qwen3-8B" and found["opcd"]["trainer"]["k"] == 256
    assert [e["id"] for e in found["envs"]] == ["textarena/frozenlake", "math/gsm_symbolic"]
    assert found["problems"] == [] and not (tmp_path / "w").exists()
