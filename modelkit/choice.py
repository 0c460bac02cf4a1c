"""The choice policy: an agent that acts by choosing among admissible actions, scored in one packed pass.

When a game lists its admissible actions, the agent's policy is the distribution over that set:
`pi(a | x) = softmax_a(log p(a | x) / tau)`, where `log p(a | x)` is the log-probability that the model's
whole reply is exactly `a` (its tokens followed by the end-of-turn token). A small model that answers an
observation with prose still ranks the actions sensibly, and a lesson in its context moves that ranking;
this module computes the ranking for acting (`agent_runtime`'s backends) and for distilling it (the divergences
of OPCD's choice objectives, `choice_divergence`; the objectives themselves are `distill.opcd.objectives`).

How one forward scores every action of every row (no repeated prompt, no per-action KV copies): each row is
laid out as [left padding][prompt][action columns][right padding]. The action columns are the tokens that must
be fed to predict the rest of each action (all its tokens but the last, the end-of-turn token), as a trie: each
distinct token prefix of the row's actions is one column ("go" once for "go north" and "go east"), and a 4-D
attention mask lets a column see the prompt, its ancestors and itself only. Its position id is its depth after
the prompt, so each action is scored exactly as if it alone followed the prompt, and actions that open alike
(ScienceWorld's hundreds of "move ... to", "focus on", "look at") cost their distinct tokens. The first token of
every action is predicted from the prompt's last position. Compute is the prompt plus the distinct prefixes,
once; memory is one (rows, queries, keys) mask. `tree=False` gives every action columns of its own (the flat
layout, each action one contiguous causal segment): the reference the trie is checked against.

The same layout continues a KV cache: `past` (a transformers cache holding each row's earlier tokens,
left-padded to one width, with `past_mask` saying which of its positions are real) makes the prompt here the
rest of the row's prompt, which is what the transformers backend's per-slot prefix cache needs.

Divergences over the set are exact (every action is scored, no sampling): reverse KL(student || teacher) is
the on-policy objective (the expectation under the student, as OPCD), forward KL the off-policy baseline,
and cross-entropy on a teacher-drawn action the SFT baseline.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from modelkit.chat_tokens import Chat, encode_chat, encode_text


def lm_parts(causal_lm) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(decoder stack returning final normalised hidden states, output head) of a causal LM."""
    config = causal_lm.config
    if getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None):
        raise NotImplementedError(
            f"{type(causal_lm).__name__} post-processes its logits (softcapping/scale); "
            "scoring from hidden states applies the output head alone and would be wrong"
        )
    return causal_lm.base_model, causal_lm.get_output_embeddings()


def action_token_ids(tokenizer, chat: Chat, prompt_ids: list[int], actions: list[str], end_id: int) -> list[list[int]]:
    """Each action's token ids as they follow the prompt of `chat` (whose ids are `prompt_ids`, from
    `encode_chat`), with the end-of-turn token `end_id` appended. Actions are data: special-token text in them
    stays text.

    Actions are tokenized on their own (cheap: a prompt can be a thousand tokens and a set fifty actions),
    after checking on the first action that this is how they tokenize after the prompt; a tokenizer that
    merges across that boundary gets each action tokenized after the full prompt instead."""
    alone = [encode_text(tokenizer, a) for a in actions]
    joined = encode_chat(tokenizer, chat, continuation=actions[0]).ids
    if joined != list(prompt_ids) + alone[0]:
        alone = []
        for action in actions:
            ids = encode_chat(tokenizer, chat, continuation=action).ids
            n = next((i for i, (x, y) in enumerate(zip(ids, prompt_ids)) if x != y), min(len(ids), len(prompt_ids)))
            alone.append(ids[n:])
    return [ids + [end_id] for ids in alone]


@dataclass
class ActionNodes:
    """The fed tokens of one row's actions (each action but its last token) as packed columns: `tokens[k]` is
    column k's token, `parents[k]` the column it continues (-1: the prompt), `depths[k]` its index in its action;
    `paths[j]` the columns action j is fed through, in order. As a trie, each distinct token prefix is one
    column; flat, every action has columns of its own."""

    tokens: list[int]
    parents: list[int]
    depths: list[int]
    paths: list[list[int]]


def action_nodes(actions: list[list[int]], *, tree: bool = True) -> ActionNodes:
    """The columns one row's actions (token ids, end-of-turn included) take in a packed forward."""
    nodes = ActionNodes([], [], [], [])
    index: dict[tuple, int] = {}
    for j, action in enumerate(actions):
        key: tuple = () if tree else (j,)
        path, parent = [], -1
        for depth, token in enumerate(action[:-1]):
            key += (token,)
            node = index.get(key)
            if node is None:
                node = index[key] = len(nodes.tokens)
                nodes.tokens.append(token)
                nodes.parents.append(parent)
                nodes.depths.append(depth)
            path.append(node)
            parent = node
        nodes.paths.append(path)
    return nodes


def _ancestry(nodes: ActionNodes) -> torch.Tensor:
    """(N, N) bool: may node q attend to node k (k is q or one of its ancestors). Parents come before their
    children, so one pass per depth finishes every row before a child copies it."""
    n = len(nodes.tokens)
    seen = torch.eye(n, dtype=torch.bool)
    parents, depths = torch.tensor(nodes.parents, dtype=torch.long), torch.tensor(nodes.depths, dtype=torch.long)
    for depth in range(1, int(depths.max()) + 1 if n else 0):
        rows = (depths == depth).nonzero().squeeze(-1)
        seen[rows] |= seen[parents[rows]]
    return seen


@dataclass
class PackedChoices:
    """One batch laid out for `choice_logprobs` (see the module docstring)."""

    input_ids: torch.Tensor  # (B, R + S): the rest of each prompt, left-padded to R, then its action columns
    position_ids: torch.Tensor  # (B, R + S)
    mask: torch.Tensor  # (B, 1, R + S, P + R + S) bool: may query q attend to key k
    first: torch.Tensor  # (B,) column of each prompt's last token (predicts every action's first token)
    columns: list[int]  # per row: how many action columns it has (from R on)
    paths: list[list[list[int]]]  # per row, per action: the input columns its fed tokens sit in, in order
    targets: list[list[list[int]]]  # per row, per action: its token ids, end-of-turn included
    rest: int  # R: the width of the prompt part


def pack_choices(
    prompts: list[list[int]],
    choices: list[list[list[int]]],
    *,
    pad_id: int,
    past_lengths: list[int] | None = None,
    past_width: int = 0,
    tree: bool = True,
) -> PackedChoices:
    """Lay out rows of (prompt token ids, action token ids with the end-of-turn token) for one forward.

    `past_lengths[i]` real tokens of row i already sit in a cache of `past_width` columns (right-aligned);
    `prompts[i]` is then the rest of that row's prompt (at least one token: it predicts the first action
    token). `tree`: each distinct token prefix of a row's actions is one column (`action_nodes`); False feeds
    every action whole (the reference the trie is checked against).
    """
    assert len(prompts) == len(choices), "one action list per prompt"
    assert all(prompts) and all(all(len(a) >= 1 for a in row) and row for row in choices), (
        "every prompt needs a token and every row at least one non-empty action"
    )
    past_lengths = past_lengths or [0] * len(prompts)
    rest = max(len(p) for p in prompts)
    rows = [action_nodes(row, tree=tree) for row in choices]
    width = rest + max(len(nodes.tokens) for nodes in rows)
    batch = len(prompts)
    ids = torch.full((batch, width), pad_id, dtype=torch.long)
    positions = torch.zeros((batch, width), dtype=torch.long)
    mask = torch.zeros((batch, 1, width, past_width + width), dtype=torch.bool)
    causal = torch.ones(rest, rest, dtype=torch.bool).tril()
    for b, (prompt, nodes) in enumerate(zip(prompts, rows)):
        start = rest - len(prompt)
        past = past_lengths[b]
        ids[b, start:rest] = torch.tensor(prompt)
        positions[b, start:rest] = torch.arange(past, past + len(prompt))
        cached = slice(past_width - past, past_width)
        prompt_cols = slice(past_width + start, past_width + rest)
        # the prompt: its cached part, then causal over its own tokens
        mask[b, 0, start:rest, cached] = True
        mask[b, 0, start:rest, prompt_cols] = causal[start:, start:]
        n = len(nodes.tokens)
        if n:
            # an action column: the whole prompt, then itself and its ancestors, at its depth after the prompt
            cols = slice(rest, rest + n)
            ids[b, cols] = torch.tensor(nodes.tokens)
            positions[b, cols] = past + len(prompt) + torch.tensor(nodes.depths)
            mask[b, 0, cols, cached] = True
            mask[b, 0, cols, prompt_cols] = True
            mask[b, 0, cols, past_width + rest : past_width + rest + n] = _ancestry(nodes)
    # padding queries attend to themselves only, so no row of the mask is empty (softmax over nothing is NaN)
    empty = ~mask.any(-1)
    if empty.any():
        b, _, q = empty.nonzero(as_tuple=True)
        mask[b, 0, q, past_width + q] = True
    return PackedChoices(
        ids,
        positions,
        mask,
        torch.full((batch,), rest - 1),
        [len(nodes.tokens) for nodes in rows],
        [[[rest + k for k in path] for path in nodes.paths] for nodes in rows],
        [[list(a) for a in row] for row in choices],
        rest,
    )


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean attention mask as the additive float mask every attention implementation accepts."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, torch.finfo(dtype).min)


def choice_logprobs(decoder, head, packed: PackedChoices, *, past=None, extend: bool = True) -> list[torch.Tensor]:
    """Per row, a (n_actions,) tensor: each action's sequence log-probability given its prompt.

    `decoder` returns final hidden states (a causal LM's `.model`), `head` is its output layer; gradients flow
    when enabled. With `past`, the cache is extended by this call (its rows then hold prompt and action columns);
    `extend=False`: a cache that is only read (`modelkit.prefix_kv.read_only_prefix`).

    The head runs once per predicting column (a row's last prompt column and each action column), not once per
    action token: actions that share a prefix share its next-token distributions, and the head over a large
    vocabulary is a good part of the cost.
    """
    device = head.weight.device
    dtype = head.weight.dtype if head.weight.is_floating_point() else torch.float32
    out = decoder(
        input_ids=packed.input_ids.to(device),
        position_ids=packed.position_ids.to(device),
        attention_mask=_additive(packed.mask.to(device), dtype),
        cache=past,
        use_cache=past is not None and extend,
    )
    hidden = out.last_hidden_state
    rows, cols, predictors, targets, owners = [], [], [], [], []
    offset = owner = 0
    for b, (paths, actions) in enumerate(zip(packed.paths, packed.targets)):
        first = int(packed.first[b])
        rows.extend([b] * (1 + packed.columns[b]))
        cols.extend([first, *range(packed.rest, packed.rest + packed.columns[b])])
        for path, action in zip(paths, actions):
            # token 0 is predicted by the prompt's last column, token t > 0 by the column fed token t - 1
            predictors.append(offset)
            predictors.extend(offset + 1 + c - packed.rest for c in path)
            targets.extend(action)
            owners.extend([owner] * len(action))
            owner += 1
        offset += 1 + packed.columns[b]
    picked = hidden[torch.tensor(rows, device=device), torch.tensor(cols, device=device)]
    logp = head(picked).float().log_softmax(-1)
    token_logp = logp[torch.tensor(predictors, device=device), torch.tensor(targets, device=device)]
    sizes = [len(actions) for actions in packed.targets]
    sums = token_logp.new_zeros(sum(sizes)).index_add(0, torch.tensor(owners, device=device), token_logp)
    return list(sums.split(sizes))


class ActionTrie:
    """The token sequences of an action set as a trie, for decoding constrained to the set (sets too large to
    score every action): `allowed(prefix)` is the tokens that continue some action, `action(ids)` the action a
    finished sequence spells. Each sequence ends with the end-of-turn token, so a finished sequence is whole."""

    def __init__(self, actions: list[str], token_ids: list[list[int]]):
        self.root: dict = {}
        self.by_ids = {tuple(ids): action for action, ids in zip(actions, token_ids)}
        for ids in token_ids:
            node = self.root
            for token in ids:
                node = node.setdefault(token, {})

    def allowed(self, prefix: list[int]) -> list[int]:
        node = self.root
        for token in prefix:
            node = node.get(token)
            if node is None:
                return []
        return list(node)

    def action(self, ids: list[int]) -> str | None:
        return self.by_ids.get(tuple(ids))


def choice_distribution(logprobs: torch.Tensor, temperature: float) -> torch.Tensor:
    """log pi(a | x) over the set: the log-softmax of the sequence log-probabilities at `temperature` (> 0)."""
    assert temperature > 0, "a distribution needs a positive temperature; greedy is the argmax"
    return (logprobs / temperature).log_softmax(-1)


def choice_divergence(
    student: list[torch.Tensor], teacher: list[torch.Tensor], *, divergence: str, temperature: float
) -> torch.Tensor:
    """Mean over rows of the divergence between the two choice policies (each row's set may differ in size).

    `reverse`: KL(student || teacher), the on-policy OPCD objective, exact over the set. `forward`:
    KL(teacher || student), the off-policy baseline. The teacher is treated as constant.
    """
    losses = []
    for s, t in zip(student, teacher):
        log_s, log_t = choice_distribution(s, temperature), choice_distribution(t.detach(), temperature)
        if divergence == "reverse":
            losses.append((log_s.exp() * (log_s - log_t)).sum())
        elif divergence == "forward":
            losses.append((log_t.exp() * (log_t - log_s)).sum())
        else:
            raise ValueError(f"unknown divergence {divergence!r}; accepted: reverse, forward")
    return torch.stack(losses).mean()
