"""Tiny models built in code, for tests, benchmarks and demos that must run offline in seconds.

`tiny_model_and_tokenizer()` trains a byte-level BPE tokenizer on a small built-in corpus (game and math
text plus the ChatML markers), gives it a ChatML chat template, and builds a randomly initialised
Llama- or Qwen2-style causal LM around it. `save_tiny_model(dir)` writes both as a normal checkpoint
directory, which every model-name field accepts as a local path.
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
    "go north", "go south", "go east", "go west", "take coin", "open door", "look", "inventory",
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
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<pad>",
                                   bos_token="<|im_start|>", unk_token="<|endoftext|>")
    fast.chat_template = CHATML_TEMPLATE
    return fast


def tiny_model_and_tokenizer(arch: str = "llama", *, hidden_size: int = 64, layers: int = 2, heads: int = 4,
                             context: int = 2048, seed: int = 0):
    """A random tiny causal LM and its tokenizer. `arch` is "llama" or "qwen2"."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    tokenizer = tiny_tokenizer()
    kinds = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}
    if arch not in kinds:
        raise ValueError(f"unknown tiny architecture {arch!r}; accepted: {', '.join(kinds)}")
    config_cls, model_cls = kinds[arch]
    config = config_cls(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=hidden_size * 2,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
        max_position_embeddings=context, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
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
