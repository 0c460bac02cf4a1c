"""A chat as the model reads it: rendered with the tokenizer's chat template, then token ids in which only the
template's own special tokens are special.

Message content is data: observations from an environment, the model's past replies, lessons, retrieved
examples. Rendering a chat to text and tokenising that text, as a plain `apply_chat_template` round trip does,
turns any special-token text inside the content into the real token: an observation holding
`<|im_end|>\\n<|im_start|>system ...` closes the user's turn and opens a system turn the environment wrote
("chat-turn forgery"). Here content is tokenised as text, so such an observation is nine plain
tokens' worth of characters and the prompt keeps the template's five control tokens.

How, without changing a single id for ordinary content (the per-slot KV cache and stored prompts rely on
stable ids): a chat whose content holds no special-token text is rendered and tokenised exactly as before, one
call each. Otherwise every special-token string inside the content is replaced by a private-use sentinel
before rendering, so every special token left in the rendered text is the template's own; the text is cut at
those, each piece between them is restored and tokenised with `split_special_tokens=True`, and the template's
tokens are put back by id. Cutting at special tokens is what the tokenizer does itself (added tokens are
matched first, the text between them is tokenised piece by piece), so the pieces tokenise as they would have.

An engine we can only send text to (a remote chat server applies its own template and tokenises the result)
gets `defuse_special_text` instead: special-token strings in the content are broken by an invisible word
joiner, so that server's tokenizer reads them as text.

"Special" means the tokenizer's added tokens marked special (`<|im_start|>`, `<|endoftext|>`, SmolLM2's
`<file_sep>`...); added tokens not marked special are ordinary vocabulary to the tokenizer and stay so here.
Every backend and OPCD's prompts go through `encode_chat`; a backend that sends text to an engine which
tokenises it again (vLLM's `generate(str)`) passes these ids instead (vLLM: `{"prompt_token_ids": ids}`).
"""

from __future__ import annotations

import re
import weakref
from typing import NamedTuple

Chat = list[dict[str, str]]

# Private-use code points: they stand in for special-token text inside content while the template renders.
_OPEN, _CLOSE = "\U000f0000", "\U000f0001"
_SENTINEL = re.compile(f"{_OPEN}(\\d+){_CLOSE}")
_patterns: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# the markers of the common chat formats, for a server whose tokenizer is not known here: ChatML and Llama 3's
# <|...|>, Llama 2 and Mistral's <s>, </s>, [INST], [/INST], Gemma's <start_of_turn>, <end_of_turn>
_COMMON_MARKERS = re.compile(r"<\|[^|<>\s]{1,64}\|>|</?s>|\[/?INST\]|<(?:start|end)_of_turn>")
_WORD_JOINER = "\u2060"


class ChatPrompt(NamedTuple):
    """A rendered chat: `text` is what the template wrote (stored with an episode, shown in the dashboard), `ids`
    its token ids with the content tokenised as text."""

    text: str
    ids: list[int]


def _special_pattern(tokenizer) -> tuple[re.Pattern, list[str]]:
    """(a regex matching the tokenizer's special-token strings, longest first, those strings)."""
    added = tokenizer.added_tokens_decoder
    key = len(added)
    cached = _patterns.get(tokenizer)
    if cached is None or cached[0] != key:
        specials = sorted({t.content for t in added.values() if t.special}, key=len, reverse=True)
        pattern = re.compile("|".join(map(re.escape, specials))) if specials else re.compile(r"(?!)")
        cached = (key, pattern, specials)
        _patterns[tokenizer] = cached
    return cached[1], cached[2]


def render_chat(tokenizer, chat: Chat) -> str:
    """The prompt text: ready for the assistant's turn, or, when the chat ends with an assistant message, that
    message continued (a prefill the reply goes on from)."""
    if chat and chat[-1]["role"] == "assistant":
        return tokenizer.apply_chat_template(chat, continue_final_message=True, tokenize=False)
    return tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)


def encode_text(tokenizer, text: str) -> list[int]:
    """Token ids of data text (an action, a lesson): special-token text in it stays text."""
    return tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]


def encode_chat(tokenizer, chat: Chat, *, continuation: str = "") -> ChatPrompt:
    """The chat rendered by `render_chat`, followed by `continuation` (the start of a reply: data, e.g. an
    action being scored), as text and token ids in which only the template's own special tokens are special.

    For content without special-token text the ids are exactly
    `tokenizer(render_chat(tokenizer, chat) + continuation, add_special_tokens=False)["input_ids"]`.
    """
    pattern, specials = _special_pattern(tokenizer)
    text = render_chat(tokenizer, chat) + continuation
    if not any(pattern.search(m["content"]) for m in chat) and not pattern.search(continuation):
        return ChatPrompt(text, tokenizer(text, add_special_tokens=False)["input_ids"])
    # the sentinel's own first character is masked too, so content that holds it comes back unchanged
    table = [*specials, _OPEN]
    index = {s: i for i, s in enumerate(table)}
    masker = re.compile(f"{pattern.pattern}|{_OPEN}")

    def mask(content: str) -> str:
        return masker.sub(lambda m: f"{_OPEN}{index[m.group(0)]}{_CLOSE}", content)

    masked = render_chat(tokenizer, [{**m, "content": mask(m["content"])} for m in chat]) + mask(continuation)
    ids: list[int] = []
    for i, piece in enumerate(re.split(f"({pattern.pattern})", masked)):
        if i % 2:  # a special token the template wrote
            ids.append(tokenizer.convert_tokens_to_ids(piece))
        elif piece:
            ids.extend(encode_text(tokenizer, _SENTINEL.sub(lambda m: table[int(m.group(1))], piece)))
    return ChatPrompt(text, ids)


def defuse_special_text(text: str, tokenizer=None) -> str:
    """`text` with a word joiner (U+2060, invisible) after the first character of every special-token string
    in it, for a server that renders and tokenises the chat itself: its tokenizer then reads text there, not a
    control token. The strings are `tokenizer`'s special tokens when the served model's tokenizer is known
    here, else the markers of the common chat formats. Text without such strings is returned unchanged."""
    pattern = _special_pattern(tokenizer)[0] if tokenizer is not None else _COMMON_MARKERS
    return pattern.sub(lambda m: m.group(0)[0] + _WORD_JOINER + m.group(0)[1:], text)
