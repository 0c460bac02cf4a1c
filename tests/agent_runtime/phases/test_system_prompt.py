"""System-prompt distillation: `agent-runtime distill CONFIG --context-file F --prompts P`
distils one fixed system prompt into an adapter, evaluated and decided like any cycle; `opcd.context` makes the
loop's cycles system-prompt cycles; a teacher with another tokenizer is refused by `distill` at once."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from agent_runtime.config import ConfigError, SystemPromptConfig
from agent_runtime.phases.system_prompt import load_context, load_prompts
from agent_runtime.testing import teach, tiny_model_and_tokenizer, tiny_tokenizer

CONTEXT = "You are a coin collector. Whatever you are asked, answer: take coin."
MOVES = ["go north", "go south", "go east", "go west", "look", "inventory", "open door"]


def ask(i: int) -> list[dict]:
    return [{"role": "user", "content": f"You are in room {i}. What do you do?"}]


def test_the_context_and_the_prompt_file_are_read_with_clear_errors(tmp_path):
    (tmp_path / "sys.txt").write_text("  Be brief.\n")
    read = load_context(SystemPromptConfig(file=str(tmp_path / "sys.txt")))
    assert read.text == "Be brief." and len(read.sha256) == 64 and read.source.endswith("sys.txt")
    assert load_context(SystemPromptConfig(text="Be brief.")).sha256 == read.sha256
    with pytest.raises(ConfigError, match="does not exist"):
        load_context(SystemPromptConfig(file=str(tmp_path / "missing.txt")))
    (tmp_path / "empty.txt").write_text("\n")
    with pytest.raises(ConfigError, match="is empty"):
        load_context(SystemPromptConfig(file=str(tmp_path / "empty.txt")))
    with pytest.raises(ValueError, match="exactly one of"):
        SystemPromptConfig(text="a", file="b")

    good = tmp_path / "prompts.jsonl"
    good.write_text(
        "\n".join(
            [
                json.dumps({"prompt": "What is 2+2?"}),
                json.dumps({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]}),
                "",
                json.dumps({"content": [{"role": "user", "content": "R"}]}),
            ]
        )
    )
    assert load_prompts(good) == [
        [{"role": "user", "content": "What is 2+2?"}],
        [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}],
        [{"role": "user", "content": "R"}],
    ]
    for line, message in [
        ('{"question": "x"}', "prompts.jsonl:1: no prompt; .* messages, prompt, content"),
        ("not json", "prompts.jsonl:1: not valid JSON"),
        (
            json.dumps({"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]}),
            "ends with an assistant",
        ),
        (json.dumps({"prompt": [{"role": "robot", "content": "Q"}]}), "needs a role"),
    ]:
        good.write_text(line)
        with pytest.raises(ConfigError, match=message):
            load_prompts(good)


def _eval_opening(config) -> str:
    """The first observation of the config's first held-out evaluation task, as evaluation plays it."""
    import environments

    entry = config.envs[0]
    env = environments.make(entry.id, **entry.kwargs)
    try:
        return env.reset(seed=config.evaluation.seed, task_id=env.tasks("eval")[0])[0]
    finally:
        env.close()


def test_a_prompt_file_holding_a_held_out_task_is_refused_naming_the_line(tmp_path, games_dir):
    """A prompt whose first user turn is, or (rendered as the agent renders it) holds, a held-out task's opening is
    a leak (an EvalLeakError, and a ConfigError about the user's file); other prompts load."""
    from agent_runtime.config import load_config
    from agent_runtime.evaluation.heldout import EvalLeakError, held_out
    from agent_runtime.phases.system_prompt import PromptFileLeakError

    config = load_config(_config_file(tmp_path, tmp_path / "model", games_dir))
    held = held_out(config, tmp_path)
    opening = _eval_opening(config)
    path = tmp_path / "prompts.jsonl"
    fine = [
        json.dumps({"prompt": ask(1)[0]["content"]}),
        json.dumps({"messages": [{"role": "system", "content": opening}, {"role": "user", "content": "Hi."}]}),
    ]
    assert len(load_prompts(_write(path, fine), held=held)) == 2, "only the first user turn is the task"
    for leaked in (
        json.dumps({"prompt": opening}),
        json.dumps(
            {
                "messages": [
                    {"role": "system", "content": "You play text games."},
                    {"role": "user", "content": f"Observation:\n{'  '.join(opening.split())}\n\nWhat do you do?"},
                ]
            }
        ),
    ):
        with pytest.raises(
            PromptFileLeakError,
            match=r"prompts.jsonl:2: the first user turn holds the opening of "
            r"held-out evaluation task",
        ) as caught:
            load_prompts(_write(path, [fine[0], leaked]), held=held)
        assert isinstance(caught.value, EvalLeakError) and isinstance(caught.value, ConfigError)
    assert len(load_prompts(path)) == 2, "without the held-out tasks nothing is checked"


def test_distill_refuses_a_prompt_file_with_a_held_out_task_before_the_cycle(tmp_path, games_dir, tiny_model_dir, cli):
    from agent_runtime.config import load_config
    from memory import ExperienceStore

    config = _config_file(tmp_path, tiny_model_dir, games_dir)
    (tmp_path / "system.txt").write_text(CONTEXT)
    prompts = _write(
        tmp_path / "prompts.jsonl",
        [json.dumps({"prompt": ask(1)[0]["content"]}), json.dumps({"prompt": _eval_opening(load_config(config))})],
    )
    proc = cli(
        "distill",
        config,
        "--workdir",
        tmp_path / "w",
        "--context-file",
        tmp_path / "system.txt",
        "--prompts",
        prompts,
        check=False,
    )
    assert proc.returncode == 2 and "prompts.jsonl:2: the first user turn holds the opening" in proc.stderr
    with ExperienceStore.open(tmp_path / "w") as store:
        assert store.cycles() == [], "no cycle was started"


def _write(path, lines):
    path.write_text("\n".join(lines))
    return path


def _taught_model(directory) -> None:
    """A tiny model that answers "take coin" when the system prompt is CONTEXT and a random move without it."""
    from distill.opcd import with_context

    model, tok = tiny_model_and_tokenizer("llama")
    coin = tok("take coin", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]

    def example(rng):
        taught = rng.random() < 0.5
        chat = with_context(ask(rng.randrange(40)), CONTEXT) if taught else ask(rng.randrange(40))
        answer = coin if taught else tok(rng.choice(MOVES), add_special_tokens=False)["input_ids"] + [coin[-1]]
        return chat, answer

    teach(model, tok, example, steps=80)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)


def _p_take_coin(model, tok, chat) -> float:
    from modelkit.chat_tokens import encode_chat

    prompt = encode_chat(tok, chat).ids
    answer = tok("take coin", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    with torch.no_grad():
        logp = model(input_ids=torch.tensor([prompt + answer])).logits[0, len(prompt) - 1 : -1].log_softmax(-1)
    return float(logp.gather(-1, torch.tensor(answer)[:, None]).sum().exp())


def _config_file(tmp_path, model_dir, games_dir, **opcd) -> str:
    data = {
        "name": "sysprompt",
        "model": {"name": str(model_dir), "max_new_tokens": 4},
        "envs": [
            {
                "id": "textworld/coin_collector",
                "max_steps": 1,
                "kwargs": {"level": 1, "n_train": 2, "n_eval": 2, "cache_dir": str(games_dir)},
            }
        ],
        "runtime": {"slots": 2},
        "evaluation": {"episodes_per_env": 2},
        "opcd": {
            "trainer": {
                "steps": 12,
                "batch_size": 4,
                "max_new_tokens": 4,
                "lr": 5e-3,
                "k": 512,
                "lora_r": 8,
                "sampler": "live",
                "temperature": 1.0,
            },
            **opcd,
        },
    }
    path = tmp_path / "sysprompt.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.mark.slow
def test_distill_a_system_prompt_over_a_prompt_file(tmp_path, games_dir, cli):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agent_runtime.config import load_config
    from agent_runtime.phases.promotion import decide_promotion
    from memory import ExperienceStore

    _taught_model(tmp_path / "model")
    (tmp_path / "system.txt").write_text(CONTEXT)
    (tmp_path / "prompts.jsonl").write_text("\n".join(json.dumps({"prompt": ask(i)[0]["content"]}) for i in range(40)))
    config = _config_file(tmp_path, tmp_path / "model", games_dir)
    workdir = tmp_path / "w"
    report = json.loads(
        cli(
            "distill",
            config,
            "--workdir",
            workdir,
            "--context-file",
            tmp_path / "system.txt",
            "--prompts",
            tmp_path / "prompts.jsonl",
            "--json",
        ).stdout
    )
    metrics = report["metrics"]
    kl = metrics["heldout_kl"]
    assert metrics["kind"] == "system_prompt" and metrics["objective"] == "tokens"
    assert kl["before"] > 0.5  # the system prompt changes the model's replies a lot
    assert kl["after"] < 0.5 * kl["before"]  # and the student without it moved most of the way
    assert metrics["prompts"] == 36 and metrics["heldout_prompts"] == 4 and metrics["lesson_kl"] == {}
    reasons = decide_promotion(metrics["evaluation"], kl["before"], kl["after"], load_config(config).opcd)
    assert report["status"] == ("rolled_back" if reasons else "promoted") and report["reasons"] == reasons

    with ExperienceStore.open(workdir) as store:
        [cycle] = store.cycles()
        assert cycle.config["kind"] == "system_prompt" and cycle.config["context"]["text"] == CONTEXT
        assert cycle.config["context"]["sha256"] == metrics["context_sha256"] and cycle.lesson_set_version is None
        conditions = {e.metrics["condition"] for e in store.evaluations(cycle_id=cycle.id)}
        assert conditions >= {"teacher_with_lessons", "teacher_without_lessons", "student_without_lessons"}
        adapter = store.get_adapter(report["adapter_id"])
    tok = AutoTokenizer.from_pretrained(tmp_path / "model")
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    before = [_p_take_coin(base, tok, ask(i)) for i in range(40, 44)]
    student = PeftModel.from_pretrained(base, adapter.path)
    after = [_p_take_coin(student, tok, ask(i)) for i in range(40, 44)]
    assert max(before) < 0.05 and min(after) > 5 * max(before)  # without the prompt, it now says "take coin"


@pytest.mark.slow
def test_a_loop_cycle_with_opcd_context_distils_the_system_prompt(tmp_path, cycle_config):
    from agent_runtime.run.loop import AgentLoop
    from memory import ExperienceStore

    loop = AgentLoop(cycle_config(context={"text": CONTEXT}), tmp_path, progress=False)
    summary = loop.run()
    loop.close()
    assert summary.cycles == 1
    with ExperienceStore.open(tmp_path) as store:
        [cycle] = store.cycles(summary.run_id)
        assert cycle.config["kind"] == "system_prompt" and cycle.config["context"]["text"] == CONTEXT
        assert cycle.metrics["kind"] == "system_prompt" and cycle.metrics["lesson_kl"] == {}
        assert cycle.metrics["objective"] == "choice"  # the run's recent prompts: choice-mode game turns
        assert "with the system prompt" in cycle.metrics["conditions"]["teacher_with_lessons"]
        assert not store.lessons(summary.run_id, status="consolidated")
        assert all(e.lesson_set_version is None for e in store.evaluations(summary.run_id, cycle_id=cycle.id))


def test_distill_refuses_a_teacher_with_another_tokenizer(tmp_path, tiny_model_dir, games_dir, cli):
    other, _ = tiny_model_and_tokenizer("llama")
    tokenizer = tiny_tokenizer(vocab_size=300)
    other.resize_token_embeddings(len(tokenizer))
    other.save_pretrained(tmp_path / "other")
    tokenizer.save_pretrained(tmp_path / "other")
    config = _config_file(tmp_path, tiny_model_dir, games_dir, teacher={"model": str(tmp_path / "other")})
    proc = cli("distill", config, "--workdir", tmp_path / "w", check=False)
    assert proc.returncode == 2
    assert "opcd.teacher.model" in proc.stderr and "does not share the student's tokenizer" in proc.stderr
    assert "512 tokens vs the teacher's 300" in proc.stderr and not (tmp_path / "w").exists()
    same = _config_file(tmp_path, tiny_model_dir, games_dir, teacher={"model": str(tiny_model_dir)})
    proc = cli("distill", same, "--workdir", tmp_path / "w", check=False)  # no run yet: the check is printed first
    assert proc.returncode == 2 and "play some episodes first" in proc.stderr
    assert "same vocabulary and special tokens as the student (512 tokens)" in proc.stdout


def test_the_cycle_page_shows_what_was_distilled_and_by_which_teacher(tmp_path):
    from fastapi.testclient import TestClient

    from agent_runtime.dashboard import create_app
    from memory import ExperienceStore

    with ExperienceStore.open(tmp_path) as store:
        run = store.create_run("r", {})
        system = store.start_cycle(
            run,
            {
                "kind": "system_prompt",
                "teacher": {"separate": True, "model": "Qwen/Qwen3-8B", "adapter": None, "vocabulary": {"same": True}},
                "context": {"sha256": "ab" * 32, "source": "data/medmcqa.txt", "text": CONTEXT},
            },
        )
        plain = store.start_cycle(run, {"opcd": {}})  # a cycle stored with no kind, teacher or context
    with TestClient(create_app(tmp_path), base_url="http://127.0.0.1") as client:
        page = client.get(f"/cycles/{system}").text
        assert "a system prompt, sha256 abababababab (data/medmcqa.txt)" in page
        assert "Qwen/Qwen3-8B, a separate model (vocabulary same as the student&#39;s)" in page
        old = client.get(f"/cycles/{plain}").text
        assert "the lesson set" in old and "the start-of-cycle policy (the parent)" in old


@pytest.mark.slow
def test_a_system_prompt_cycle_needs_no_lessons(tmp_path, cycle_config):
    """opcd.context alone: the loop plays and distils the system prompt, with lessons off."""
    from agent_runtime.run.loop import AgentLoop

    config = cycle_config(context={"text": CONTEXT})
    config.lessons.enabled = False
    loop = AgentLoop(config, tmp_path, progress=False)
    summary = loop.run()
    loop.close()
    assert summary.cycles == 1 and summary.extractions == 0
