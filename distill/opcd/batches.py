"""What each OPCD training step is given, apart from the models: the prompt stream (shuffled passes over a prompt
list, or any iterator), the context each prompt's teacher sees (`context_picker`: one string, lesson pools drawn
per prompt, a prompt's own scoped pools, or a callable), the anchors mixed into every step (prompts the student
is held to its parent on: `with_anchors`, `anchors_in_step`) and the held-back validation prompts
(`split_validation`), and the learning rate of each step (`lr_factor`)."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator, Sequence

from distill.opcd.policies import PromptContexts
from modelkit.chat_tokens import Chat

ContextSource = str | Sequence[str] | PromptContexts | Callable[[Chat], str]


def split_validation(items: list, fraction: float, seed: int) -> tuple[list, list]:
    """(train, validation): a seeded `fraction` of `items` (at least one, never all) held back."""
    order = list(range(len(items)))
    random.Random(f"validation:{seed}").shuffle(order)
    held = min(len(items) - 1, max(1, round(fraction * len(items))))
    kept = sorted(order[held:])
    return [items[i] for i in kept], [items[i] for i in sorted(order[:held])]


def anchors_in_step(index: int, batch_size: int, share: float) -> int:
    """How many of step `index`'s `batch_size` prompts are anchors: the running total is round(share x prompts so
    far), so every step holds floor or ceil of share x batch_size and the share over the run is exact."""
    return round(share * batch_size * (index + 1)) - round(share * batch_size * index)


def with_anchors(
    source,
    pick: Callable[[Chat], str],
    anchors: Sequence[Chat],
    choices: Sequence[list[str]] | None,
    anchor_choices: Sequence[list[str]] | None,
):
    """(the prompt sequence, a context picker that gives the anchors none, the anchors as prompt items)."""
    if not isinstance(source, Sequence):
        raise TypeError("anchors need a sequence of prompts, not an iterator")
    if (choices is None) != (anchor_choices is None):
        raise ValueError("give anchor_choices exactly when choices are given (one action set per anchor)")
    if anchor_choices is not None and len(anchor_choices) != len(anchors):
        raise ValueError(f"{len(anchors)} anchors but {len(anchor_choices)} action sets")
    anchors = [list(chat) for chat in anchors]  # own objects: the picker tells them apart by identity
    anchored = {id(chat) for chat in anchors}
    extra = list(zip(anchors, anchor_choices)) if anchor_choices is not None else anchors
    return source, lambda chat: "" if id(chat) in anchored else pick(chat), extra


def prompt_stream(source, rng: random.Random) -> Iterator[Chat]:
    if isinstance(source, Sequence):
        if not source:
            raise ValueError("no prompts to train on")

        def cycle() -> Iterator[Chat]:
            while True:
                order = list(range(len(source)))
                rng.shuffle(order)
                yield from (source[i] for i in order)

        return cycle()
    return iter(source)


def context_picker(source: ContextSource, rng: random.Random) -> Callable[[Chat], str]:
    if isinstance(source, str):
        return lambda chat: source
    if isinstance(source, PromptContexts):
        return lambda chat: rng.choice(source.pools(chat))
    if callable(source):
        return source
    pools = list(source)
    if not pools:
        raise ValueError("context_source is an empty sequence; give at least one lesson pool")
    return lambda chat: rng.choice(pools)


def lr_factor(config, step: int) -> float:
    """The learning rate at `step` as a share of `config.lr`: linear warm-up from a tenth, then constant or a
    cosine decay to a tenth at `config.steps`."""
    if step < config.warmup_steps:
        return 0.1 + 0.9 * step / config.warmup_steps
    if config.lr_schedule == "constant":
        return 1.0
    progress = min(1.0, (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps))
    return 0.1 + 0.45 * (1.0 + math.cos(math.pi * progress))
