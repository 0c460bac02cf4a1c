"""CLI tests: every command end to end on tiny budgets, in process through `main(argv)`; the installed entry
point (`python -m agent_runtime`) once per command in a subprocess."""

from __future__ import annotations

import json

import pytest

from agent_runtime import __version__
from agent_runtime.cli import build_parser

COMMANDS = ("run", "eval", "distill", "memory", "lessons", "envs", "setup", "dashboard", "report")


def test_every_command_has_a_subprocess_smoke_test():
    [commands] = [a for a in build_parser()._actions if a.choices and "run" in a.choices]
    assert set(commands.choices) == set(COMMANDS)


@pytest.mark.parametrize("command", [c for c in COMMANDS if c != "run"])
def test_each_command_starts_as_a_process(command, cli_process):
    """The entry point imports and parses every command (`run` is started for real below)."""
    out = cli_process(command, "--help").stdout
    assert out.startswith(f"usage: agent-runtime {command}") or f"agent-runtime {command}" in out.splitlines()[0]


def test_help_and_version(cli):
    out = cli("--help").stdout
    for command in COMMANDS:
        assert command in out
    assert cli("--version").stdout.strip() == f"agent-runtime {__version__}"
    assert "--resume" in cli("run", "--help").stdout
    assert cli("no-such-command", check=False).returncode == 2


@pytest.mark.slow
def test_run_smoke_config_then_memory_stats(tmp_path, games_dir, cli, cli_process):
    """`run` as a real process (the progress bar on its stderr), then the memory it left, in process."""
    workdir = tmp_path / "smoke"
    proc = cli_process(
        "run",
        "configs/smoke.yaml",
        "--workdir",
        workdir,
        "--episodes",
        40,
        "--json",
        "--set",
        f"envs.0.kwargs.cache_dir={games_dir}",
        "--set",
        "envs.0.kwargs.n_train=4",
    )
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["episodes"] == 40 and summary["new_episodes"] == 40
    assert "PLAY" in proc.stderr  # the progress bar
    stats = json.loads(cli("memory", "stats", "--workdir", workdir, "--json").stdout)
    assert stats["runs"] == 1 and stats["episodes"] == 40 and stats["steps"] >= 40 and stats["lessons"] == 0
    text = cli("memory", "stats", "--workdir", workdir).stdout
    assert "episodes" in text and "40" in text
    assert (workdir / "config.resolved.yaml").is_file() and (workdir / "run.log.jsonl").is_file()


@pytest.mark.slow
def test_run_tiny_model(tmp_path, games_dir, tiny_model_dir, cli):
    workdir = tmp_path / "tiny"
    proc = cli(
        "run",
        "configs/quickstart.yaml",
        "--workdir",
        workdir,
        "--episodes",
        2,
        "--no-progress",
        "--set",
        f"model.name={tiny_model_dir}",
        "--set",
        "model.max_new_tokens=4",
        "--set",
        f"envs.0.kwargs.cache_dir={games_dir}",
        "--set",
        "envs.0.kwargs.n_train=4",
        "--set",
        "envs.0.max_steps=3",
    )
    assert "run 1: 2 episodes" in proc.stdout and "success" in proc.stdout
    stats = json.loads(cli("memory", "stats", "--workdir", workdir, "--json").stdout)
    assert stats["episodes"] == 2 and stats["steps"] >= 2


def test_user_errors_exit_2_with_a_message(tmp_path, cli):
    bad = tmp_path / "bad.yaml"
    bad.write_text("envs: [{id: textworld/coin_collector}]\nruntime: {slotz: 2}\n")
    proc = cli("run", bad, "--workdir", tmp_path / "w", check=False)
    assert proc.returncode == 2 and "runtime.slotz: unknown key" in proc.stderr and "Traceback" not in proc.stderr
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("envs: [{id: textworld/nope}]\n")
    proc = cli("run", unknown, "--workdir", tmp_path / "w2", check=False)
    assert proc.returncode == 2 and "textworld/coin_collector" in proc.stderr  # lists the known ids
    proc = cli(
        "run",
        "configs/smoke.yaml",
        "--workdir",
        tmp_path / "w3",
        "--set",
        "model.backend=transformers",
        "--set",
        "model.options={}",
        "--set",
        "model.name=not-a-model",
        check=False,
    )
    assert proc.returncode == 2 and "smollm2-135m-instruct" in proc.stderr
    proc = cli("memory", "stats", "--workdir", tmp_path / "empty", check=False)
    assert proc.returncode == 2 and "no memory.db" in proc.stderr


@pytest.mark.slow
def test_lessons_and_memory_commands(tmp_path, games_dir, cli):
    workdir = tmp_path / "lessons"
    cli(
        "run",
        "configs/smoke.yaml",
        "--workdir",
        workdir,
        "--episodes",
        16,
        "--no-progress",
        "--set",
        f"envs.0.kwargs.cache_dir={games_dir}",
        "--set",
        "envs.0.kwargs.n_train=4",
        "--set",
        "lessons.enabled=true",
        "--set",
        "lessons.extract_every=8",
        "--set",
        "lessons.gate_episodes=0",
        "--set",
        "lessons.embedder=hash",
        "--set",
        "model.options.lesson_reply='- EXPERIENCE ITEM: Read the goal before you move.'",
    )
    listed = json.loads(cli("lessons", "list", "--workdir", workdir, "--json").stdout)
    # the same item from each environment's episodes: a lesson per environment, each scoped to its own
    assert listed["version"] == 2 and {x["text"] for x in listed["lessons"]} == {"Read the goal before you move."}
    assert sorted(x["scope"] for x in listed["lessons"]) == [["math/gsm_symbolic"], ["textworld/coin_collector"]]
    sources = 0
    for lesson in listed["lessons"]:
        shown = json.loads(cli("lessons", "show", lesson["id"], "--workdir", workdir, "--json").stdout)
        assert shown["status"] == "active" and {e["env_id"] for e in shown["source_episodes"]} == set(lesson["scope"])
        sources += len(shown["source_episodes"])
    assert sources == 16
    lesson_id = listed["lessons"][0]["id"]
    assert "from episode" in cli("lessons", "show", lesson_id, "--workdir", workdir).stdout
    diff = json.loads(cli("lessons", "diff", 1, 2, "--workdir", workdir, "--json").stdout)
    assert (
        lesson_id in [x["id"] for x in diff["added"]] and diff["removed"][0]["text"] == "Read the goal before you move."
    )
    back = json.loads(cli("lessons", "rollback", 1, "--workdir", workdir, "--json").stdout)
    assert back["new_version"] == 3
    assert json.loads(cli("lessons", "list", "--workdir", workdir, "--json").stdout)["version"] == 3
    proc = cli("lessons", "rollback", 99, "--workdir", workdir, check=False)
    assert proc.returncode == 2 and "99" in proc.stderr

    export = tmp_path / "export.jsonl"
    counts = json.loads(cli("memory", "export", export, "--workdir", workdir, "--json").stdout)
    assert counts["episodes"] == 16
    copy = tmp_path / "copy"
    copy.mkdir()
    imported = json.loads(cli("memory", "import", export, "--workdir", copy, "--json").stdout)
    assert imported["episodes"] == 16 and imported["lessons"] == counts["lessons"]
    again = tmp_path / "again.jsonl"
    cli("memory", "export", again, "--workdir", copy)
    strip = [line for line in export.read_text().splitlines()[1:]]
    assert strip == again.read_text().splitlines()[1:]  # exact round trip (the header names the source)
    hits = json.loads(cli("memory", "search", "goal before moving", "--workdir", workdir, "--json").stdout)
    assert hits and hits[0]["text"] == "Read the goal before you move."
    cli("memory", "reindex", "--workdir", workdir)


def test_no_progress_turns_the_model_libraries_bars_off_for_the_run_and_back_on_after(monkeypatch):
    """`run --no-progress`: transformers' own bars ("Loading weights") are off while the run runs, in this process
    and (through the environment) in those it starts; afterwards they are as they were, and a user's own setting
    of the variable is theirs."""
    import os

    from transformers.utils import logging as hf_logging

    from agent_runtime.cli.commands import _library_progress

    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    hf_logging.enable_progress_bar()
    with _library_progress(enabled=False):
        assert not hf_logging.is_progress_bar_enabled() and os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
    assert hf_logging.is_progress_bar_enabled() and "HF_HUB_DISABLE_PROGRESS_BARS" not in os.environ
    with _library_progress(enabled=True):  # without --no-progress nothing changes
        assert hf_logging.is_progress_bar_enabled() and "HF_HUB_DISABLE_PROGRESS_BARS" not in os.environ
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "0")  # the user asked for bars: theirs to have
    with _library_progress(enabled=False):
        assert hf_logging.is_progress_bar_enabled() and os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "0"
