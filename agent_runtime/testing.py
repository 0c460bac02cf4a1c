"""Tiny models built in code, for tests, benchmarks and demos that must run offline in seconds.

`tiny_model_and_tokenizer()` trains a byte-level BPE tokenizer on a small built-in corpus (game and math
text plus the ChatML markers), gives it a ChatML chat template, and builds a randomly initialised
Llama- or Qwen2-style causal LM around it. `save_tiny_model(dir)` writes both as a normal checkpoint
directory, which every model-name field accepts as a local path.

Also the doubles and helpers several test files share: `teach` (a few supervised steps that give a tiny model a
behaviour a test can see), `save_coin_lesson_model` (a tiny model that takes the coin only when a lesson says so,
for the consolidation, forgetting and probe tests) and `StaleAdapterBackend` (a backend whose adapter switches
never reach its model).
"""

from __future__ import annotations

from pathlib import Path

import torch

CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<pad>"]

_CORPUS = [
    "You are in a kitchen. There is a closed door to the north and an exit to the east.",
    "go north",
    "go south",
    "go east",
    "go west",
    "take coin",
    "open door",
    "look",
    "inventory",
    "You see a coin on the floor. Taken. You win! Your score has just gone up by one point.",
    "Admissible actions: go north | go east | take coin | look",
    "Lessons from your past experience: explore every exit before going back.",
    "Solve the math problem. The answer is 42. 3 + 4 = 7, so the final answer is \\boxed{7}.",
    "[up] [down] [left] [right] The frozen lake has holes. Reach the goal. Move the box onto the target.",
    "system user assistant EXPERIENCE ITEM: When the room is dark, look first.",
    "0 1 2 3 4 5 6 7 8 9 10 100 + - * / = ( ) , . ! ? : ;",
]


def tiny_tokenizer(vocab_size: int = 512):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<pad>",
        bos_token="<|im_start|>",
        unk_token="<|endoftext|>",
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast


def tiny_model_and_tokenizer(
    arch: str = "llama",
    *,
    hidden_size: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int | None = None,
    context: int = 2048,
    seed: int = 0,
):
    """A random tiny causal LM and its tokenizer. `arch` is "llama" or "qwen2"; `kv_heads` (default: `heads`)
    fewer than `heads` gives grouped-query attention."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    tokenizer = tiny_tokenizer()
    kinds = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}
    if arch not in kinds:
        raise ValueError(f"unknown tiny architecture {arch!r}; accepted: {', '.join(kinds)}")
    config_cls, model_cls = kinds[arch]
    config = config_cls(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads or heads,
        max_position_embeddings=context,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = model_cls(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def save_tiny_model(directory: str | Path, arch: str = "llama", **kwargs) -> Path:
    directory = Path(directory)
    model, tokenizer = tiny_model_and_tokenizer(arch, **kwargs)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


COIN_LESSON = "When you see a coin, take coin at once."


def teach(model, tokenizer, example, *, steps: int, batch: int = 16, lr: float = 5e-3, seed: int = 0) -> None:
    """Plain supervised steps that give `model` a behaviour a test can see: `example(rng)` draws one
    (chat, reply token ids) pair; the loss is on the reply only (the chat as `encode_chat` renders it), AdamW,
    gradients clipped at 1.0, one step per batch."""
    import random

    from modelkit.chat_tokens import encode_chat

    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    for _ in range(steps):
        rows = [(encode_chat(tokenizer, chat).ids, list(reply)) for chat, reply in (example(rng) for _ in range(batch))]
        width = max(len(p) + len(a) for p, a in rows)
        ids = torch.full((len(rows), width), tokenizer.pad_token_id)
        labels, mask = torch.full_like(ids, -100), torch.zeros_like(ids)
        for r, (p, a) in enumerate(rows):
            ids[r, : len(p) + len(a)] = torch.tensor(p + a)
            labels[r, len(p) : len(p) + len(a)] = torch.tensor(a)
            mask[r, : len(p) + len(a)] = 1
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()


def save_coin_lesson_model(directory: str | Path, games_cache: str | Path, lesson: str = COIN_LESSON) -> Path:
    """A tiny model that chooses `take coin` when `lesson` is in its system prompt and another admissible action
    without it, on the loop's own first-turn prompts (choice mode) of level-1 coin-collector games (4 train and 4
    eval tasks, each at its evaluation seed and another): a behaviour a cycle can consolidate and a forget undo."""
    import environments
    from agent_runtime.episode.prompt import PromptBuilder

    model, tokenizer = tiny_model_and_tokenizer("llama")
    env = environments.make("textworld/coin_collector", level=1, n_train=4, n_eval=4, cache_dir=str(games_cache))
    builder = PromptBuilder(family="textworld", count_tokens=lambda chat: 0, context_window=4096, action_mode="choice")
    firsts = []
    for split in ("train", "eval"):
        for i, task in enumerate(env.tasks(split)):
            for seed in (i, 1234 + i):
                observation, info = env.reset(seed=seed, task_id=task)
                firsts.append((observation, info["admissible_actions"]))
    env.close()

    def example(rng):
        observation, actions = rng.choice(firsts)
        taught = rng.random() < 0.5
        chat = builder.build([], observation, actions, lessons=[lesson] if taught else [])
        action = "take coin" if taught else rng.choice([a for a in actions if a != "take coin"])
        return chat, tokenizer(action, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]

    teach(model, tokenizer, example, steps=60)
    directory = Path(directory)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


class StaleAdapterBackend:
    """A real backend whose adapter loads and switches never reach its model: it says it acts with the new
    adapter and keeps computing with the weights it had (the failure reported for asynchronous LoRA updates in
    other trainers). What the post-promotion probe must catch."""

    def __init__(self, inner):
        self._inner = inner
        self.adapters: dict[str, str] = dict(getattr(inner, "adapters", {}))
        self.active_adapter = getattr(inner, "active_adapter", None)

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def load_adapter(self, name, path):
        self.adapters[name], self.active_adapter = str(path), name

    def use_adapter(self, name):
        self.active_adapter = name

    def adapter_fingerprint(self):
        return self._inner.adapter_fingerprint()

    def choose(self, prompts, choices, params):
        return self._inner.choose(prompts, choices, params)

    def generate(self, prompts, params):
        return self._inner.generate(prompts, params)
