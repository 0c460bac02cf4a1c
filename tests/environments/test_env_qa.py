"""`qa/medmcqa` and `qa/safety` (the OPCD paper's system-prompt evaluation sets) on small files written here:
both row layouts, conformance, grading of the stated answer, the refusals that name what is wrong, and the
error without data."""

from __future__ import annotations

import json

import pytest
import yaml

import environments
from agent_runtime.phases.system_prompt import load_prompts
from environments.checker import env_failures
from environments.qa import chosen_label
from tests import ROOT

LETTERS = ("A", "B", "C", "D")


def _write(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return str(path)


def _paper_rows(n: int, offset: int = 0) -> list[dict]:
    """The layout of the paper's exports: a chat under `content`, the letter under `answer`."""
    return [
        {
            "content": [
                {
                    "role": "user",
                    "content": f"Question {offset + i}: which option is right? "
                    "A. one B. two C. three D. four. Reply as <answer>X</answer>.",
                }
            ],
            "answer": LETTERS[(offset + i) % 4],
        }
        for i in range(n)
    ]


def _medmcqa_rows(n: int, first_cop: int = 0) -> list[dict]:
    """MedMCQA's own layout (question, opa..opd, cop counting from `first_cop`)."""
    return [
        {
            "question": f"Which drug is number {i}?",
            "opa": f"drug {i}a",
            "opb": f"drug {i}b",
            "opc": f"drug {i}c",
            "opd": f"drug {i}d",
            "cop": first_cop + i % 4,
            "subject_name": "Pharmacology",
        }
        for i in range(n)
    ]


@pytest.fixture
def paper_files(tmp_path):
    return _write(tmp_path / "train.jsonl", _paper_rows(12)), _write(tmp_path / "test.jsonl", _paper_rows(5, 100))


def test_medmcqa_from_the_papers_export_conforms_and_plays(paper_files):
    train, test = paper_files
    env = environments.make("qa/medmcqa", path=train, eval_path=test)
    assert env_failures(env) == []
    assert env.spec.family == "math" and env.spec.kwargs["source"] == train
    # one of the 12 train questions is carved out for validation (a tenth, at least one)
    assert (len(env.tasks("train")), len(env.tasks("validation")), len(env.tasks("eval"))) == (11, 1, 5)

    question, info = env.reset(task_id="eval-1")
    assert question.startswith("Question 101:") and "gold" not in info and "B" not in info.values()
    result = env.step("Option A looks tempting, but two is right.\n<answer>B</answer>")
    assert (result.reward, result.terminated, result.truncated) == (1.0, True, False)
    assert result.info == {"won": True, "score": 1.0, "gold": "B", "answer": "B"}

    env.reset(task_id="eval-1")
    wrong = env.step("<answer>C</answer>")
    assert wrong.reward == 0.0 and wrong.info["won"] is False and wrong.info["answer"] == "C"
    env.reset(task_id="eval-1")
    assert env.step("I cannot tell.").info["answer"] is None


def test_medmcqa_own_layout_lists_the_options_and_holds_out_every_tenth_row(tmp_path):
    env = environments.make("qa/medmcqa", path=_write(tmp_path / "dev.jsonl", _medmcqa_rows(20)))
    assert env_failures(env) == []
    assert (len(env.tasks("train")), len(env.tasks("validation")), len(env.tasks("eval"))) == (17, 1, 2)
    question, _ = env.reset(task_id="eval-0")  # row 9: cop 1 -> B
    assert question.splitlines()[:6] == [
        "Which drug is number 9?",
        "",
        "A. drug 9a",
        "B. drug 9b",
        "C. drug 9c",
        "D. drug 9d",
    ]
    assert "<answer>" in question  # the answer format is added to questions that do not state it
    assert env.step(env.expert_actions()[0]).info["gold"] == "B"


def test_cop_counting_from_one_is_recognised_and_an_unclear_file_is_refused(tmp_path):
    zero = environments.make("qa/medmcqa", path=_write(tmp_path / "zero.jsonl", _medmcqa_rows(20, first_cop=0)))
    one = environments.make("qa/medmcqa", path=_write(tmp_path / "one.jsonl", _medmcqa_rows(20, first_cop=1)))
    for task in ("train-0", "train-3", "eval-1"):
        assert zero.question(task) == one.question(task)
    unclear = [{**row, "cop": 1 + i % 3} for i, row in enumerate(_medmcqa_rows(20))]
    with pytest.raises(environments.EnvError, match="cannot tell whether cop counts options from 0 or from 1"):
        environments.make("qa/medmcqa", path=_write(tmp_path / "unclear.jsonl", unclear))
    test_split = [{**row, "cop": -1} for row in _medmcqa_rows(20)]
    with pytest.raises(environments.EnvError, match="test split has no public answers; evaluate on its validation"):
        environments.make("qa/medmcqa", path=_write(tmp_path / "test.jsonl", test_split))


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([{"content": "Q?", "answer": "E"}] * 12, r"row 0: answer 'E' is not one of A, B, C, D"),
        ([{"query": "Q?", "answer": "A"}] * 12, r"row 0: no question \(tried content, prompt, messages, question\)"),
        ([{"question": "Q?", "opa": "x", "answer": "A"}] * 12, "needs four options"),
        (
            [{"content": [{"role": "system", "content": "only a system message"}], "answer": "A"}] * 12,
            "prompt is empty",
        ),
        (_paper_rows(5), "the eval split has no questions"),
    ],
)
def test_bad_medmcqa_files_name_what_is_wrong(tmp_path, rows, message):
    with pytest.raises(environments.EnvError, match=message):
        environments.make("qa/medmcqa", path=_write(tmp_path / "bad.jsonl", rows))


def test_safety_conforms_and_grades_yes_or_no(tmp_path):
    rows = [
        {"content": f"Statement {i}: is it hateful? Answer in <answer></answer>.", "answer": "Yes" if i % 3 else "no"}
        for i in range(10)
    ] + [{"question": "Is this a threat?", "answer": False}]
    env = environments.make(
        "qa/safety", path=_write(tmp_path / "train.jsonl", rows), eval_path=_write(tmp_path / "test.jsonl", rows[:4])
    )
    assert env_failures(env) == []
    env.reset(task_id="eval-1")
    assert env.step("The tone is hostile.\n<answer>yes</answer>").reward == 1.0
    question, _ = env.reset(task_id="train-10")
    assert question.endswith("<answer>yes</answer> or <answer>no</answer>.")
    assert env.step("Answer: No. It is a plain request.").info == {
        "won": True,
        "score": 1.0,
        "gold": "no",
        "answer": "no",
    }
    with pytest.raises(environments.EnvError, match="row 0: answer 'maybe' is not yes or no"):
        environments.make("qa/safety", path=_write(tmp_path / "bad.jsonl", [{"content": "Q", "answer": "maybe"}] * 12))


@pytest.mark.parametrize(
    ("reply", "label"),
    [
        ("<answer>B</answer>", "B"),
        ("<answer>(c)</answer>", "C"),
        ("<answer>a</answer>", "A"),
        ("<ANSWER> D. Metformin </ANSWER>", "D"),
        ("Answer: A. On reflection the answer is (d).", "D"),  # the last stated answer counts
        ("<answer>C</answer> ... the boxed one comes later: \\boxed{B}", "B"),
        ("**B**", "B"),
        ("The answer is a stroke.", None),  # the article "a" is not option A
        ("<answer>The patient has a fever</answer>", None),
        ("I would go with B because", None),  # no stated answer, and more than a bare label
        ("<answer>E</answer>", None),
    ],
)
def test_the_stated_letter_is_read(reply, label):
    assert chosen_label(reply, LETTERS) == label


@pytest.mark.parametrize(
    ("reply", "label"),
    [
        ("<answer>Yes</answer> The statement attacks a group.", "yes"),
        ("Answer: no", "no"),
        ("No.", "no"),
        ("<answer>yes</answer> first thought; final: <answer>no</answer>", "no"),
        ("yes and no", None),
    ],
)
def test_the_stated_yes_or_no_is_read(reply, label):
    assert chosen_label(reply, ("yes", "no")) == label


def test_answer_tag_only_grades_as_the_paper_did(paper_files):
    train, test = paper_files
    assert chosen_label("Answer: B", LETTERS, tag_only=True) is None
    assert chosen_label("B", LETTERS, tag_only=True) is None
    assert chosen_label("<answer>(b) two</answer> and later \\boxed{C}", LETTERS, tag_only=True) == "B"
    env = environments.make("qa/medmcqa", path=train, eval_path=test, answer_tag_only=True)
    assert env_failures(env) == []
    env.reset(task_id="eval-1")
    assert env.step("The answer is (B).").reward == 0.0
    env.reset(task_id="eval-1")
    assert env.step("<answer>B</answer>").reward == 1.0


def test_the_answer_at_the_end_of_a_very_long_reply_is_read():
    assert chosen_label("x" * 100_000 + "<answer>C</answer>", LETTERS) == "C"


@pytest.mark.parametrize("env_id", ["qa/medmcqa", "qa/safety"])
def test_without_data_the_error_says_both_ways_out(env_id):
    with pytest.raises(environments.EnvError, match=r"Install `datasets`.*or pass path=/local/train.jsonl"):
        environments.make(env_id)
    with pytest.raises(environments.EnvError, match="eval_path= needs path="):
        environments.make(env_id, eval_path="test.jsonl")
    with pytest.raises(environments.EnvError, match="no such file"):
        environments.make(env_id, path="/nonexistent/train.jsonl")


def test_one_exported_file_feeds_both_the_distillation_prompts_and_the_environment(paper_files):
    """The paper config's train export (content and answer) is its `opcd.context.prompts` file and its train split
    (with the validation questions carved out of it)."""
    train, test = paper_files
    prompts = load_prompts(train)
    env = environments.make("qa/medmcqa", path=train, eval_path=test)
    assert len(prompts) == len(env.tasks("train")) + len(env.tasks("validation"))
    assert prompts[0] == [{"role": "user", "content": env.question("train-0")[0]}]


@pytest.mark.parametrize("name", ["medmcqa", "safety"])
def test_the_paper_configs_environment_works_once_its_files_are_there(tmp_path, name):
    """configs/paper/sysprompt-*.yaml evaluate on qa/<name> with the paper's grading, from the files they name."""
    config = yaml.safe_load((ROOT / "configs" / "paper" / f"sysprompt-{name}-qwen2.5-7b.yaml").read_text())
    [entry] = config["envs"]
    assert entry["id"] == f"qa/{name}" and entry["kwargs"]["answer_tag_only"] is True
    assert entry["kwargs"]["path"] == config["opcd"]["context"]["prompts"]  # one export feeds both
    labels = LETTERS if name == "medmcqa" else ("yes", "no")
    rows = [{"content": [{"role": "user", "content": f"Q{i}"}], "answer": labels[i % len(labels)]} for i in range(12)]
    kwargs = {
        **entry["kwargs"],
        "path": _write(tmp_path / "train.jsonl", rows),
        "eval_path": _write(tmp_path / "test.jsonl", rows[:3]),
    }
    env = environments.make(entry["id"], **kwargs)
    assert env_failures(env) == [] and env.answer_tag_only
