"""The objective registry: the config accepts exactly the registered names, and the trainer runs whatever a name
declares: a test's own objective (half OPCD's loss) steps a tiny model on both paths, with no trainer change."""

from __future__ import annotations

import copy

import pytest
import torch
from pydantic import ValidationError

from agent_runtime.testing import tiny_model_and_tokenizer
from distill.opcd.config import OPCDConfig
from distill.opcd.objectives import (
    OPCD,
    DuplicateObjectiveError,
    Objective,
    get_objective,
    list_objectives,
    register,
    unregister,
)
from distill.opcd.trainer import OPCDTrainer

SYSTEM = {"role": "system", "content": "You play a text game."}
CHATS = [[SYSTEM, {"role": "user", "content": f"You are in room {i}. What do you do?"}] for i in range(3)]
SETS = [["go north", "open door", "look"], ["take coin", "inventory"], ["[up]", "[down]", "look"]]
LESSON = "Lessons from your past experience: always look."


def half_token_loss(student_logits, teacher_logits, targets, *, k, temperature, tail):
    per_token, gap = OPCD.token_loss(student_logits, teacher_logits, targets, k=k, temperature=temperature, tail=tail)
    return 0.5 * per_token, gap


def half_choice_loss(student, teacher, *, temperature, generator):
    return 0.5 * OPCD.choice_loss(student, teacher, temperature=temperature, generator=generator)


HALF = Objective(
    name="half_opcd",
    description="a test's objective: half OPCD's loss",
    samples="student",
    token_loss=half_token_loss,
    choice_loss=half_choice_loss,
)


@pytest.fixture
def half():
    register(HALF)
    yield HALF
    if HALF.name in list_objectives():
        unregister(HALF.name)


@pytest.fixture(scope="module")
def models():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls gain nothing from threads on a shared machine
    model, tokenizer = tiny_model_and_tokenizer()
    teacher, _ = tiny_model_and_tokenizer(seed=1)
    with torch.no_grad():
        teacher.get_output_embeddings().weight.mul_(20.0)  # a teacher far from the student: a clear loss
    yield model, teacher, tokenizer
    torch.set_num_threads(threads)


def _step(models, objective: str, choices=None) -> dict:
    model, teacher, tokenizer = models
    config = OPCDConfig(
        objective=objective, lr=1e-2, lora_r=4, batch_size=3, k=16, max_new_tokens=4, temperature=0.9,
        sampler="live", gradient_checkpointing=False,
    )  # fmt: skip
    torch.manual_seed(0)  # the same LoRA initialisation for every objective
    trainer = OPCDTrainer(copy.deepcopy(model), tokenizer, config, teacher_model=teacher)
    return trainer.step(CHATS, [LESSON] * len(CHATS), choices)


def test_the_built_in_objectives_are_registered_method_first():
    assert list_objectives()[:3] == ["opcd", "off_policy", "sft"]
    assert [get_objective(name).on_policy for name in ("opcd", "off_policy", "sft")] == [True, False, False]


def test_an_unknown_objective_is_refused_with_the_accepted_names():
    with pytest.raises(ValidationError, match=r"unknown objective 'dpo'; accepted: opcd, off_policy, sft"):
        OPCDConfig(objective="dpo")
    with pytest.raises(ValueError, match=r"unknown objective 'dpo'; accepted: opcd, off_policy, sft"):
        get_objective("dpo")


def test_a_tail_treatment_is_refused_for_an_objective_that_reads_no_tail():
    with pytest.raises(ValidationError, match=r"applies to the KL objectives \(opcd, off_policy\), not to .*'sft'"):
        OPCDConfig(objective="sft", tail="renormalize")
    assert OPCDConfig(objective="sft", tail="drop").tail == "drop"


def test_a_name_is_registered_once_and_refused_once_unregistered(half):
    with pytest.raises(DuplicateObjectiveError, match="half_opcd"):
        register(HALF)
    assert OPCDConfig(objective="half_opcd").objective == "half_opcd"
    unregister("half_opcd")
    with pytest.raises(ValidationError, match="unknown objective 'half_opcd'"):
        OPCDConfig(objective="half_opcd")


def test_a_registered_objective_is_accepted_and_run_by_the_trainer(models, half):
    assert OPCDConfig(objective="half_opcd").objective == "half_opcd"
    for choices in (None, SETS):  # the token path (the student samples), then the choice path
        ours, opcd = _step(models, "half_opcd", choices), _step(models, "opcd", choices)
        assert ours["objective"] == "half_opcd" and opcd["loss"] > 0.01
        assert ours["loss"] == pytest.approx(0.5 * opcd["loss"], rel=1e-5)  # the same samples, half the loss
        assert ours["kl_estimate"] == pytest.approx(opcd["kl_estimate"], rel=1e-5)  # on-policy: estimated


def test_sft_on_choices_is_the_cross_entropy_of_an_action_the_teacher_draws():
    student = [torch.tensor([-1.0, -2.0, -3.0])]
    teacher = [torch.tensor([-100.0, 0.0, -100.0])]  # the teacher all but surely picks action 1
    loss = get_objective("sft").choice_loss(student, teacher, temperature=1.0, generator=torch.Generator())
    assert float(loss) == pytest.approx(-float(student[0].log_softmax(-1)[1]))
