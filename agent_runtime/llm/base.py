"""The policy backend protocol: one small, batched interface that every way of generating text implements.

`generate(prompts, params)` takes a batch of chats (lists of `{"role", "content"}` messages) and returns one
`Completion` per chat, in order. A completion carries the text, the generated token ids, the token counts and,
when asked for and the backend can, per-token log-probabilities. Batching is the runtime's job (the episode
runner sends every live environment slot's prompt in one call); a backend is free to split a batch further.

Beyond that, a backend may have optional capabilities, each a protocol here: `ChoiceBackend` (act by choosing
among admissible actions), `AdapterBackend` (act with LoRA adapters, loaded by path), `FingerprintBackend` (it
reports the fingerprint of the adapter weights it acts with, `modelkit.fingerprint`), `TokenizerBackend` (its
model's own tokenizer counts tokens), `LocalModelBackend` (the model lives in this process, on a device) and
`SleepingBackend` (its engine can free its accelerator memory for a while). What a run needs is checked once,
where its backend is built (`agent_runtime.llm.check_capabilities`); code handed a backend by a caller that
did not check it (the episode runner) checks with `require`, which names the backend and what needs it. An
optional capability is used with `isinstance`; nobody probes with `hasattr`.

Seeds. `SamplingParams.seeds` gives each prompt of a call its own seed, and a `RowSeededBackend` draws everything for
that row (its tokens, its pick of an action) from a generator seeded with it alone: a row samples the same whichever
rows share its batch and however many calls came before, which is what lets a killed and resumed run replay (PLAY
derives a row's seed from the run seed, the draw and the turn: `agent_runtime.episode.runner.turn_seed`). A call with
only `seed` seeds its rows with seeds derived from it and the row's place (`row_seeds`); greedy ignores both.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from hashlib import blake2b
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

Message = dict[str, str]
Chat = list[Message]


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 32
    temperature: float = 0.7  # 0 means greedy
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    logprobs: bool = False
    seed: int | None = None  # the call's seed: row i draws with `derive_seed(seed, i)` when `seeds` is None
    seeds: tuple[int, ...] | None = None  # one per prompt: the row's own seed, whatever else is in the batch


def derive_seed(*key: object) -> int:
    """A 63-bit seed from `key` (its parts joined with ':' and hashed with BLAKE2b): every seed a run derives comes
    from here, and it fits both a torch generator and a vLLM request's seed."""
    digest = blake2b(":".join(map(str, key)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def row_seeds(params: SamplingParams, rows: int) -> list[int] | None:
    """Each row's seed in a call of `rows` prompts: `params.seeds`, else derived from `params.seed` and the row's
    place, else None (unseeded: the backend's own generator)."""
    if params.seeds is not None:
        if len(params.seeds) != rows:
            raise ValueError(
                f"SamplingParams.seeds has {len(params.seeds)} seeds for {rows} prompts; give one per prompt"
            )
        return list(params.seeds)
    return None if params.seed is None else [derive_seed(params.seed, row) for row in range(rows)]


@dataclass
class Completion:
    text: str
    token_ids: list[int]
    prompt_tokens: int
    finish_reason: str = "stop"  # "stop" (EOS or a stop string) or "length"
    logprobs: list[float] | None = None
    prompt_text: str = ""  # the prompt as the model saw it (chat template applied), for the experience store
    latency_s: float = 0.0
    completion_tokens: int = -1  # defaults to len(token_ids); a remote chat model may report a count without ids
    # choice mode: log pi(a) of every action of the set offered, in its order (None: not a choice, or a backend
    # that only knows the chosen action); `text` is then the chosen action and `logprobs` [log pi(chosen)]
    choice_logprobs: list[float] | None = None

    def __post_init__(self) -> None:
        if self.completion_tokens < 0:
            self.completion_tokens = len(self.token_ids)


class BackendError(RuntimeError):
    """A backend cannot be built or cannot serve a request; the message says what to change."""


@runtime_checkable
class PolicyBackend(Protocol):
    name: str

    @property
    def context_window(self) -> int: ...

    def count_tokens(self, chat: Chat) -> int:
        """Tokens the chat takes as a prompt (chat template included)."""

    def generate(self, prompts: list[Chat], params: SamplingParams) -> list[Completion]: ...

    def close(self) -> None: ...


@runtime_checkable
class ChoiceBackend(Protocol):
    """A backend that can act in choice mode: for each chat, one action drawn from `choices[i]`.

    The draw follows the backend's own distribution over the set (temperature applies; greedy at 0), and the
    completion's text is exactly one element of the set. What "its own distribution" is depends on the
    backend (the transformers backend: the softmax of every action's sequence log-probability; vLLM: decoding
    constrained to the set; a remote chat model: its free reply mapped to the closest action)."""

    def choose(self, prompts: list[Chat], choices: list[list[str]], params: SamplingParams) -> list[Completion]: ...


@runtime_checkable
class AdapterBackend(Protocol):
    """A backend that acts with LoRA adapters: each loaded once by name from a path, one (or none) in use."""

    adapters: dict[str, Any]  # loaded adapters by name
    active_adapter: str | None

    def load_adapter(self, name: str, path: str) -> None: ...

    def use_adapter(self, name: str | None) -> None:
        """Act with the loaded adapter `name`, or the base model (None)."""


@runtime_checkable
class FingerprintBackend(Protocol):
    """A backend that says which weights it acts with: the fingerprint (`modelkit.fingerprint`) of the active
    adapter's LoRA tensors, computed when the adapter was loaded, from what the backend itself holds (the
    transformers backend: the tensors in its model) or gave its engine (vLLM, a vLLM server: the adapter's files)."""

    def adapter_fingerprint(self) -> str | None:
        """The active adapter's fingerprint; None when acting with the base model."""


@runtime_checkable
class TokenizerBackend(Protocol):
    """A backend with its model's own tokenizer (a Hugging Face tokenizer): it counts text tokens exactly."""

    tokenizer: Any


@runtime_checkable
class LocalModelBackend(Protocol):
    """A backend whose model and tokenizer live in this process: its device is where a learner next to it
    trains."""

    model: Any  # the torch module that generates
    tokenizer: Any
    device: Any  # a torch.device


@runtime_checkable
class SleepingBackend(Protocol):
    """A backend whose engine can give its accelerator memory back while something else (an OPCD cycle) trains
    on the same device, and take it again after (vLLM's sleep mode)."""

    def sleep(self) -> bool:
        """Free the memory; False when this engine cannot (then nothing was done)."""

    def wake_up(self) -> None: ...


@runtime_checkable
class RowSeededBackend(Protocol):
    """A backend whose draws for a row come from that row's seed alone (`row_seeds`), so a run played with it replays
    (a remote chat API takes no seed per request and is not one: an episode played with it records `replays: false`).
    The seed fixes the draw; the numbers drawn from are the backend's, which may differ in their last bits with the
    batch a row shares (padding, kernels chosen by shape): that moves a draw only where it lands that close to the
    boundary between two outcomes."""

    row_seeded: Literal[True]


Capability = TypeVar("Capability")

_CAPABILITIES = {
    ChoiceBackend: "choose among admissible actions",
    AdapterBackend: "act with LoRA adapters",
    FingerprintBackend: "report the fingerprint of its adapter weights",
    TokenizerBackend: "count tokens with its own tokenizer",
    SleepingBackend: "free its memory",
    LocalModelBackend: "hold its weights in this process",
    RowSeededBackend: "seed each row's draws by itself",
}


def require(backend: PolicyBackend, capability: type[Capability], purpose: str) -> Capability:
    """`backend` as a `capability` backend, or a BackendError saying which backend lacks what, for what."""
    if not isinstance(backend, capability):
        name = getattr(backend, "name", type(backend).__name__)
        raise BackendError(f"{purpose} needs a backend that can {_CAPABILITIES[capability]}; the {name} backend cannot")
    return backend


def activate(backend: PolicyBackend, adapter) -> None:
    """Make `backend` act with `adapter` (anything with `name` and `path`, such as the store's AdapterInfo;
    loaded on first use) or with the base model (None; a backend without adapters already does)."""
    if adapter is None:
        if isinstance(backend, AdapterBackend):
            backend.use_adapter(None)
        return
    backend = require(backend, AdapterBackend, f"acting with adapter {adapter.name}")
    if adapter.name not in backend.adapters:
        backend.load_adapter(adapter.name, str(adapter.path))
    backend.use_adapter(adapter.name)


@contextmanager
def acting(backend: PolicyBackend, adapter) -> Iterator[PolicyBackend]:
    """Within the block `backend` acts with `adapter` (as `activate`); after it, also when the block raises, with
    what it acted with before (the adapter it had in use, still loaded, or the base model)."""
    before = backend.active_adapter if isinstance(backend, AdapterBackend) else None
    activate(backend, adapter)
    try:
        yield backend
    finally:
        if isinstance(backend, AdapterBackend):
            backend.use_adapter(before)


def closest_action(reply: str, choices: list[str]) -> str:
    """The action of `choices` nearest to a free reply: an exact (case-insensitive) match, else the action the
    reply starts with or contains, else the most similar string (difflib ratio)."""
    import difflib

    text = reply.strip().lower()
    lowered = [c.lower() for c in choices]
    if text in lowered:
        return choices[lowered.index(text)]
    first_line = text.splitlines()[0].strip() if text else ""
    for candidates in ([c for c in lowered if first_line.startswith(c)], [c for c in lowered if c in text]):
        if candidates:
            return choices[lowered.index(max(candidates, key=len))]
    return max(choices, key=lambda c: difflib.SequenceMatcher(None, text, c.lower()).ratio())


@dataclass
class BackendStats:
    """Cumulative counters a backend keeps; the loop reports tokens/s from them."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    completions: int = 0  # returned over all calls (a running total: a list per call grew for the whole run)

    def record(self, completions: list[Completion], seconds: float) -> None:
        self.calls += 1
        self.prompt_tokens += sum(c.prompt_tokens for c in completions)
        self.completion_tokens += sum(c.completion_tokens for c in completions)
        self.seconds += seconds
        self.completions += len(completions)


def apply_stop(text: str, stop: tuple[str, ...]) -> tuple[str, bool]:
    """Cut `text` at the first stop string; say whether one was found."""
    cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)
