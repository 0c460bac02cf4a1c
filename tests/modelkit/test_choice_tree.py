"""Scoring a choice's actions over their shared token prefixes (a trie packed into one forward) gives every action
the log-probability it has when fed whole, alone after its prompt (shared prefixes or none, one action, one action
the prefix of another, a prompt that ends inside a word), and OPCD's choice objective the same loss and gradient.
Tiny models built in code; float32."""

from __future__ import annotations

import copy
import functools

import pytest
import torch

from modelkit.chat_tokens import encode_chat, encode_text
from modelkit.choice import (
    action_nodes,
    action_token_ids,
    choice_logprobs,
    lm_parts,
    pack_choices,
)

SYSTEM = {"role": "system", "content": "You are playing a text adventure game. Reply with exactly one command."}
ROOM = [SYSTEM, {"role": "user", "content": "You are in a kitchen. There is a closed door to the north."}]
COIN = [SYSTEM, {"role": "user", "content": "You see a coin on the floor."}]
SETS = {
    "shared prefixes": ["go north", "take coin", "go east", "go west", "take coin from the box", "look"],
    "no shared prefix": ["look", "inventory", "take coin", "open door"],
    "a single action": ["go north"],
    "one action the prefix of another": ["go", "go north", "look", "go north door"],
}


@pytest.fixture(scope="module")
def tiny():
    from agent_runtime.testing import tiny_model_and_tokenizer

    model, tokenizer = tiny_model_and_tokenizer()
    return model.eval(), tokenizer


def _one_forward_per_action(model, prompt: list[int], actions: list[list[int]]) -> list[float]:
    """Each action's log-probability from a forward of its own over prompt + action: the reference."""
    out = []
    for action in actions:
        logp = model(torch.tensor([prompt + action])).logits.log_softmax(-1)[0]
        out.append(sum(float(logp[len(prompt) - 1 + k, t]) for k, t in enumerate(action)))
    return out


def _scores(model, prompts, actions, *, tree: bool) -> list[list[float]]:
    packed = pack_choices(prompts, actions, pad_id=0, tree=tree)
    return [row.tolist() for row in choice_logprobs(*lm_parts(model), packed)]


@pytest.mark.parametrize("case", list(SETS))
def test_tree_scores_equal_flat_scores_and_a_forward_per_action(tiny, case):
    model, tokenizer = tiny
    end = tokenizer.eos_token_id
    chats = [ROOM, COIN]
    prompts = [encode_chat(tokenizer, c).ids for c in chats]
    actions = [action_token_ids(tokenizer, c, p, SETS[case], end) for c, p in zip(chats, prompts)]
    with torch.no_grad():
        tree, flat = _scores(model, prompts, actions, tree=True), _scores(model, prompts, actions, tree=False)
        for prompt, row, got, reference in zip(prompts, actions, tree, flat):
            assert got == pytest.approx(reference, abs=1e-5)
            assert got == pytest.approx(_one_forward_per_action(model, prompt, row), abs=1e-4)
    columns = len(action_nodes(actions[0]).tokens)
    fed = sum(len(a) - 1 for a in actions[0])
    shared = len({tuple(a[: k + 1]) for a in actions[0] for k in range(len(a) - 1)})
    assert columns == shared  # each distinct prefix once
    assert (columns < fed) == (case in ("shared prefixes", "one action the prefix of another"))


def test_tree_positions_are_depths_and_a_column_sees_only_its_ancestors(tiny):
    """The layout itself: "go" is fed once for "go", "go north" and "go east"; "north" and "east" sit at the same
    position (depth 1 after the prompt) and neither sees the other."""
    _, tokenizer = tiny
    prompt = encode_chat(tokenizer, ROOM).ids
    actions = action_token_ids(tokenizer, ROOM, prompt, ["go", "go north", "go east"], tokenizer.eos_token_id)
    packed = pack_choices([prompt], [actions], pad_id=0)
    go, north, east = packed.paths[0][1][0], packed.paths[0][1][1], packed.paths[0][2][1]
    assert packed.paths[0][0] == [go] and packed.paths[0][2][0] == go and packed.columns == [3]
    positions = packed.position_ids[0]
    assert positions[go] == len(prompt) and positions[north] == positions[east] == len(prompt) + 1
    mask = packed.mask[0, 0]
    assert mask[north, go] and mask[east, go] and not mask[north, east] and not mask[east, north]
    assert mask[go, : len(prompt)].all() and not mask[go, north]


def test_the_tokenization_boundary_case_scores_the_same(tiny):
    """A prompt that ends inside a word (an assistant prefill "take co"): each action's ids after it differ from
    its ids alone, and the actions that merge with the prompt's end still share their first token."""
    model, tokenizer = tiny
    chat = [*COIN, {"role": "assistant", "content": "take co"}]
    options = ["in", "in box", "at"]
    prompt = encode_chat(tokenizer, chat).ids
    actions = action_token_ids(tokenizer, chat, prompt, options, tokenizer.eos_token_id)
    assert [a[:-1] for a in actions] != [encode_text(tokenizer, o) for o in options], "the boundary case"
    assert len(action_nodes(actions).tokens) < sum(len(a) - 1 for a in actions), "a prefix shared"
    with torch.no_grad():
        [tree], [flat] = _scores(model, [prompt], [actions], tree=True), _scores(model, [prompt], [actions], tree=False)
        assert tree == pytest.approx(flat, abs=1e-5)
        assert tree == pytest.approx(_one_forward_per_action(model, prompt, actions), abs=1e-4)


def _trainer(tiny):
    from agent_runtime.testing import tiny_model_and_tokenizer
    from distill.opcd import OPCDConfig, OPCDTrainer

    model, tokenizer = tiny
    teacher, _ = tiny_model_and_tokenizer(seed=1)
    with torch.no_grad():
        teacher.get_output_embeddings().weight.mul_(20.0)  # the two choice policies differ clearly
    config = OPCDConfig(objective="opcd", lr=1e-2, lora_r=8, batch_size=2, temperature=1.0, gradient_checkpointing=True)
    torch.manual_seed(0)
    return OPCDTrainer(copy.deepcopy(model), tokenizer, config, teacher_model=teacher)


def test_opcd_choice_training_gets_the_gradient_of_flat_scoring(tiny, monkeypatch):
    """One OPCD step on the choice policy: the loss and every LoRA gradient (read as the optimizer steps) are
    flat scoring's, through the teacher's scores, the student's shared system-prompt cache and checkpointing."""
    import distill.opcd.trainer as trainer_module

    lesson = "Lessons from your past experience:\n- Take the coin before you go anywhere."
    chats, options = [ROOM, COIN], [SETS["shared prefixes"], SETS["one action the prefix of another"]]

    def step(tree: bool):
        if not tree:
            monkeypatch.setattr(trainer_module, "pack_choices", functools.partial(pack_choices, tree=False))
        trainer = _trainer(tiny)
        grads = []
        trainer.optimizer.register_step_pre_hook(
            lambda *_: grads.extend(p.grad.detach().clone() for p in trainer._params)
        )
        [metrics] = trainer.train(chats, lesson, steps=1, choices=options)
        return metrics, grads

    tree_metrics, tree_grads = step(True)
    flat_metrics, flat_grads = step(False)
    assert tree_metrics["loss"] > 1e-3 and tree_metrics["loss"] == pytest.approx(flat_metrics["loss"], rel=1e-4)
    assert tree_metrics["train_tokens"] < flat_metrics["train_tokens"]
    assert len(tree_grads) == len(flat_grads) > 0 and any(g.abs().sum() > 0 for g in tree_grads)
    for got, expected in zip(tree_grads, flat_grads):
        torch.testing.assert_close(got, expected, rtol=1e-3, atol=1e-6)
