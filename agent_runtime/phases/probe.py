"""After a promotion, prove that the acting policy is the promoted adapter: a probe of a few fixed prompts whose
log-probabilities must have moved from the parent's as the adapter's own forward predicts.

Why. Trainers that update LoRA weights asynchronously have a known failure: a rollout worker keeps the old
weights (a switch that did not happen, a file loaded before it was complete, another file at the path) and the
run goes on playing, and training on, the old policy's episodes, with every record saying the new adapter
acted. The fingerprint each episode stores (`modelkit.fingerprint`) says which tensors a backend loaded; this
probe says that the backend computes with them.

The reference (`build_reference`), where the cycle ran: a fresh transformers model in float32 (not the acting
backend, which is what is checked), with the parent adapter and with the new one, on the `PROBE_PROMPTS`
decisions, of up to `CANDIDATE_PROMPTS` from the cycle's own training episodes, that the adapter moved most
(where a stale backend is farthest from it). Choice-mode
decisions keep their action set; a free-mode prompt gets a set of candidate replies (the parent's and the
adapter's greedy replies, and two seeded samples of the adapter), so that every backend that can choose is
probed with exact choice log-probabilities. For backends that cannot report a choice distribution (the chat
backend: a vLLM server), the reference also keeps each prompt's greedy reply under either policy, with its
per-token log-probabilities under both. The reference is stored with the cycle (`metrics["probe"]`).

The check (`measure` on the acting side, `judge` on the driver): the acting backend answers the same prompts at
temperature 0 (`choose`; or, lacking a choice distribution, `generate` with log-probabilities, compared on the
tokens of whichever reference reply it reproduced). Distances are in probability, so that the numerics of
actions the policy all but excludes do not count: per prompt the total variation between choice distributions
(per greedy token, the difference of its probability), the largest over the prompts. The acting policy must be
within `tolerance` of the adapter and nearer to it than to the parent; the probe is conclusive when the adapter
moved the prompts by more than twice the tolerance (`shift`), and says so when it did not (a warning: the two
policies are then indistinguishable within numerics, so playing one for the other changes nothing measurable).
Otherwise `StaleAdapterError` stops the run, naming the backend or worker and the numbers. The tolerance, from
measured numerics, is decided in `tolerance_for`.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from agent_runtime.llm import training_device
from agent_runtime.llm.base import ChoiceBackend, SamplingParams
from agent_runtime.phases.turn_prompts import episode_prefixes

log = logging.getLogger("agent_runtime.probe")

PROBE_PROMPTS = 4
CANDIDATE_PROMPTS = 16
GREEDY_TOKENS = 8
FLOAT32_TOLERANCE = 0.01
LOW_PRECISION_TOLERANCE = 0.15
_GREEDY = SamplingParams(max_new_tokens=GREEDY_TOKENS, temperature=0.0, logprobs=True)
_FILLERS = ("I do not know.", "Let me think.")
_SAMPLE = SamplingParams(max_new_tokens=GREEDY_TOKENS, temperature=1.0, seed=0)  # a free prompt's two samples
_CHOOSE = SamplingParams(max_new_tokens=GREEDY_TOKENS, temperature=0.0, seed=0)


class StaleAdapterError(RuntimeError):
    """An acting backend does not compute with the promoted adapter (it acts as the parent, or as neither)."""

    def __init__(self, result: ProbeResult):
        self.result = result
        like = (
            "it acts as the parent"
            if result.to_parent < result.to_adapter
            else "it acts as neither the adapter nor its parent"
        )
        super().__init__(
            f"{result.where} does not act with adapter {result.adapter} after its promotion: {like} "
            f"(probe distance to the adapter {result.to_adapter:.4f}, to the parent {result.to_parent:.4f}; the "
            f"adapter moved the probe by {result.shift:.4f}; tolerance {result.tolerance:g}, {result.mode} probe of "
            f"{result.prompts} prompts; fingerprint {result.fingerprint or 'not reported'}, the trainer's "
            f"{result.expected_fingerprint or 'not recorded'}). The run stops rather than play and train on "
            "another policy's episodes: reload the adapter on that backend (restart the worker or server) and "
            "`run --resume`"
        )


@dataclass
class GreedyReply:
    """A reference greedy reply (its text and token ids) with its tokens' log-probabilities under both policies."""

    text: str
    token_ids: list[int]
    adapter: list[float]
    parent: list[float]


@dataclass
class ProbeReference:
    """What the probe expects of an acting backend after a promotion (stored as `cycle.metrics["probe"]`)."""

    adapter_id: int
    adapter: str
    parent: str | None
    fingerprint: str | None  # of the files the trainer wrote (the adapter row's)
    prompts: list[list[dict]]
    choices: list[list[str]]
    adapter_logprobs: list[list[float]]  # choice log-probabilities with the adapter, one list per prompt
    parent_logprobs: list[list[float]]
    greedy: list[list[GreedyReply]] = field(default_factory=list)  # per prompt: the adapter's, the parent's
    computed_on: str = ""

    @property
    def shift(self) -> float:
        """How far the adapter moved the probe from its parent (the choice probe's distance)."""
        return choice_distance(self.adapter_logprobs, self.parent_logprobs)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProbeReference:
        greedy = [[GreedyReply(**r) for r in replies] for replies in data.get("greedy", [])]
        return cls(**{**data, "greedy": greedy})


@dataclass
class Measurement:
    """An acting backend's answers to the probe: choice log-probabilities, or greedy replies, or neither."""

    mode: str  # "choice", "greedy" or "none"
    choice_logprobs: list[list[float]] = field(default_factory=list)
    replies: list[tuple[str, list[float]]] = field(default_factory=list)  # (text, per-token log-probabilities)
    fingerprint: str | None = None
    problem: str = ""


@dataclass
class ProbeResult:
    where: str
    adapter: str
    mode: str
    prompts: int
    to_adapter: float
    to_parent: float
    shift: float
    tolerance: float
    verdict: str  # "adapter", "inconclusive", "unverifiable", or "stale" (then StaleAdapterError is raised)
    fingerprint: str | None = None
    expected_fingerprint: str | None = None
    note: str = ""

    def line(self) -> str:
        if self.verdict == "unverifiable":
            return f"adapter probe of {self.where}: not verifiable ({self.note})"
        return (
            f"adapter probe of {self.where}: {self.verdict} ({self.mode}, {self.prompts} prompts: distance to "
            f"adapter {self.adapter} {self.to_adapter:.4f}, to its parent {self.to_parent:.4f}, shift "
            f"{self.shift:.4f}, tolerance {self.tolerance:g})" + (f"; {self.note}" if self.note else "")
        )


def tolerance_for(model_config, backend_name: str) -> float:
    """The probe's tolerance for a backend acting with `model_config`, from measured numerics: SmolLM2-135M-Instruct
    with an adapter our OPCD trainer wrote, 6 coin-game prompts of 4 actions, the largest total variation against
    the float32 transformers reference (base model and adapter alike; the adapter itself moved the prompts by 0.90).
    vLLM's CPU engine in float32: 1e-5 (`tests/agent_runtime/llm/test_vllm.py` asserts choice log-probabilities within 2e-3);
    transformers in bfloat16: 0.065; vLLM in bfloat16: 0.10. So `FLOAT32_TOLERANCE` = 0.01 for a backend configured
    in float32, and `LOW_PRECISION_TOLERANCE` = 0.15 (1.5x the worst measured) for bfloat16, float16, `auto` and a
    backend whose precision is not known here (a server). Log-probabilities themselves are no measure for this:
    bfloat16 moved the log-probability of an action the policy all but excluded by 3.0 nats, at a probability of
    1e-4."""
    precise = model_config.dtype == "float32" and backend_name in ("transformers", "vllm")
    return FLOAT32_TOLERANCE if precise else LOW_PRECISION_TOLERANCE


# -- distances ---------------------------------------------------------------------------------------------------
def _total_variation(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b), f"choice sets of {len(a)} and {len(b)} actions"
    return 0.5 * sum(abs(math.exp(x) - math.exp(y)) for x, y in zip(a, b))


def choice_distance(a: list[list[float]], b: list[list[float]]) -> float:
    """The largest total variation between two sets of per-prompt choice distributions (log-probabilities)."""
    return max((_total_variation(x, y) for x, y in zip(a, b, strict=True)), default=0.0)


def _token_distance(a: list[float], b: list[float]) -> float:
    return max((abs(math.exp(x) - math.exp(y)) for x, y in zip(a, b)), default=0.0)


# -- the acting side ---------------------------------------------------------------------------------------------
def measure(backend, reference: ProbeReference) -> Measurement:
    """The acting `backend`'s answers to the probe (run where the backend is: the loop, or a rollout worker)."""
    from agent_runtime.llm.base import FingerprintBackend

    fingerprint = backend.adapter_fingerprint() if isinstance(backend, FingerprintBackend) else None
    if isinstance(backend, ChoiceBackend) and reference.prompts:
        out = backend.choose(reference.prompts, reference.choices, _CHOOSE)
        if all(c.choice_logprobs is not None for c in out):
            return Measurement("choice", [list(c.choice_logprobs) for c in out], fingerprint=fingerprint)
    if reference.greedy:
        out = backend.generate(reference.prompts, _GREEDY)
        if all(c.logprobs is not None for c in out):
            return Measurement("greedy", replies=[(c.text, list(c.logprobs)) for c in out], fingerprint=fingerprint)
    return Measurement(
        "none",
        fingerprint=fingerprint,
        problem=f"the {backend.name} backend reports neither a choice distribution nor log-probabilities",
    )


def judge(reference: ProbeReference, measured: Measurement, *, where: str, tolerance: float) -> ProbeResult:
    """The verdict on one acting backend; a stale one raises `StaleAdapterError` (see the module docstring)."""
    result = ProbeResult(
        where,
        reference.adapter,
        measured.mode,
        len(reference.prompts),
        math.nan,
        math.nan,
        reference.shift,
        tolerance,
        "unverifiable",
        measured.fingerprint,
        reference.fingerprint,
    )
    if measured.mode == "none":
        result.note = measured.problem
        log.warning(result.line())
        return result
    if measured.mode == "choice":
        result.to_adapter = choice_distance(measured.choice_logprobs, reference.adapter_logprobs)
        result.to_parent = choice_distance(measured.choice_logprobs, reference.parent_logprobs)
    else:
        _greedy_distances(reference, measured, result)
    if result.shift <= 2 * tolerance:
        result.verdict = "inconclusive"
        result.note = "the adapter moved the probe too little to tell it from its parent within numerics"
        log.warning(result.line())
        return result
    if result.to_adapter <= tolerance and result.to_adapter < result.to_parent:
        result.verdict = "adapter"
        log.info(result.line())
        return result
    result.verdict = "stale"
    raise StaleAdapterError(result)


def _greedy_distances(reference: ProbeReference, measured: Measurement, result: ProbeResult) -> None:
    """Distances on the tokens of each prompt's reference reply that the backend reproduced (the adapter's or the
    parent's greedy reply); a backend that reproduced neither on any prompt is as far as can be from both."""
    to_adapter, to_parent, shift = [], [], []
    for replies, (text, logprobs) in zip(reference.greedy, measured.replies, strict=True):
        reply = next((r for r in replies if r.text == text), None)
        if reply is None:
            continue
        n = min(len(logprobs), len(reply.adapter))
        to_adapter.append(_token_distance(logprobs[:n], reply.adapter[:n]))
        to_parent.append(_token_distance(logprobs[:n], reply.parent[:n]))
        shift.append(_token_distance(reply.adapter[:n], reply.parent[:n]))
    if not shift:
        result.to_adapter = result.to_parent = 1.0
        result.note = "its greedy replies are neither the adapter's nor the parent's on any probe prompt"
        return
    result.to_adapter, result.to_parent, result.shift = max(to_adapter), max(to_parent), max(shift)
    result.note = f"compared on the tokens of the {len(shift)} greedy replies it reproduced"


# -- the reference -----------------------------------------------------------------------------------------------
@torch.no_grad()
def _forced_logprobs(ref, chat: list[dict], token_ids: list[int]) -> tuple[list[float], int]:
    """(log p(token | prompt, earlier tokens) of `token_ids` after `chat` under the reference's active policy, the
    tokens that went through the model)."""
    import contextlib

    from modelkit.chat_tokens import encode_chat

    if not token_ids:
        return [], 0
    prompt = encode_chat(ref.tokenizer, chat).ids
    ids = torch.tensor([prompt + token_ids], device=ref.device)
    base = ref.active_adapter is None and ref.adapters
    with ref.model.disable_adapter() if base else contextlib.nullcontext():
        logits = ref.model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    picked = logits.log_softmax(-1).gather(-1, torch.tensor(token_ids, device=ref.device)[:, None])[:, 0]
    return picked.tolist(), ids.shape[1]


def _reply_tokens(completion) -> list[int]:
    """The reply's tokens without the end-of-turn token it stopped at (its text's tokens)."""
    return completion.token_ids[:-1] if completion.finish_reason == "stop" else completion.token_ids


def build_reference(
    model_path: str,
    adapter,
    parent,
    decisions: list[tuple[list[dict], list[str] | None]],
    *,
    device: str = "cpu",
    shared_weights=None,
    count=None,
) -> ProbeReference:
    """The probe's expectations for `adapter` (its `id`, `name`, `path` and `fingerprint`) over its `parent` (or the
    base model: None), from a fresh float32 transformers forward on `device`. Of `decisions` ((chat, action set or
    None) of the cycle's episodes; the first `CANDIDATE_PROMPTS`), the probe keeps the `PROBE_PROMPTS` on which
    the adapter moved the choice distribution most: there a stale backend is farthest from it. `shared_weights`:
    a float32 model of `model_path` already loaded on `device` (the acting backend's): the reference's own modules
    and adapters then sit on a view of its base weights instead of a second copy (`modelkit.weights`).
    `count(prompt_tokens=, generated_tokens=, decisions=)`, when given, is told the work the reference model did
    (`agent_runtime.state.profile.count_work`: this model is not the acting backend whose counters the profile
    reads)."""
    from agent_runtime.llm.transformers_backend import TransformersBackend
    from distill.opcd.teacher import load_tokenizer
    from modelkit.weights import base_view, can_share

    decisions = decisions[:CANDIDATE_PROMPTS]
    assert decisions, "the probe needs at least one prompt"
    if shared_weights is not None and can_share(shared_weights, torch.float32, torch.device(device)):
        ref = TransformersBackend(
            base_view(shared_weights),
            load_tokenizer(model_path, pad=True),
            dtype="float32",
            device=device,
            prefix_cache=False,
        )
    else:
        ref = TransformersBackend.from_pretrained(model_path, dtype="float32", device=device, prefix_cache=False)
    parent_name = "parent" if parent is not None else None
    try:
        if parent is not None:
            ref.load_adapter("parent", parent.path)
        ref.load_adapter("adapter", adapter.path)
        chats = [chat for chat, _ in decisions]

        def greedy_of(indices: list[int]) -> dict:
            out = {parent_name: {}, "adapter": {}}
            for name in (parent_name, "adapter") if indices else ():
                ref.use_adapter(name)
                out[name] = dict(zip(indices, ref.generate([chats[i] for i in indices], _GREEDY)))
            return out

        # a free-mode prompt's candidate replies come from generation; a choice-mode one keeps its action set, so
        # its greedy replies are generated only if it is kept (of 16 choice prompts, 4: most of the probe's work)
        free = [i for i, (_, options) in enumerate(decisions) if not options]
        greedy, samples = greedy_of(free), []
        if free:
            ref.use_adapter("adapter")
            samples = ref.generate([chats[i] for i in free] * 2, _SAMPLE)
        choices = [list(options) if options else None for _, options in decisions]
        for k, i in enumerate(free):
            replies = [greedy["adapter"][i], greedy[parent_name][i], samples[k], samples[len(free) + k]]
            candidates = list(dict.fromkeys(c.text for c in replies if c.text.strip()))
            if len(candidates) < 2:  # both policies said the same: the set still measures how surely
                candidates = list(dict.fromkeys([*candidates, *_FILLERS]))[:2]
            choices[i] = candidates
        scored = {}
        for name in ("adapter", parent_name):
            ref.use_adapter(name)
            scored[name] = [c.choice_logprobs for c in ref.choose(chats, choices, _CHOOSE)]
        moved = sorted(range(len(chats)), key=lambda i: -_total_variation(scored["adapter"][i], scored[parent_name][i]))
        kept = sorted(moved[:PROBE_PROMPTS])
        for name, more in greedy_of([i for i in kept if i not in greedy["adapter"]]).items():
            greedy[name].update(more)
        replies = [
            [GreedyReply(c.text, _reply_tokens(c), [], []) for c in (greedy["adapter"][i], greedy[parent_name][i])]
            for i in kept
        ]
        forced = 0
        for name, field_name in (("adapter", "adapter"), (parent_name, "parent")):
            ref.use_adapter(name)
            for i, pair in zip(kept, replies):
                for reply in pair:
                    logprobs, fed = _forced_logprobs(ref, chats[i], reply.token_ids)
                    setattr(reply, field_name, logprobs)
                    forced += fed
        if count is not None:
            stats = ref.stats
            count(
                prompt_tokens=stats.prompt_tokens + forced,
                generated_tokens=stats.completion_tokens,
                decisions=stats.completions,
            )
    finally:
        ref.close()
    return ProbeReference(
        adapter_id=adapter.id,
        adapter=adapter.name,
        parent=parent.name if parent is not None else None,
        fingerprint=adapter.fingerprint,
        prompts=[chats[i] for i in kept],
        choices=[choices[i] for i in kept],
        adapter_logprobs=[scored["adapter"][i] for i in kept],
        parent_logprobs=[scored[parent_name][i] for i in kept],
        greedy=replies,
        computed_on=f"transformers float32 on {device}",
    )


# -- where the loop and the executors call it ----------------------------------------------------------------------
def probe_decisions(run, cycle, backend) -> list[tuple[list[dict], list[str] | None]]:
    """The probe's fixed prompts for `cycle`: decisions of its own training episodes (choice-mode ones when the
    cycle distilled a choice policy), the first turn of each episode first, in episode order; a system-prompt
    cycle trained on a prompt file probes with that file's first prompts."""
    from agent_runtime.phases.system_prompt import load_prompts

    opcd = run.config.opcd
    if not cycle.episode_ids and opcd.context is not None and opcd.context.prompts:
        return [(chat, None) for chat in load_prompts(opcd.context.prompts)[:PROBE_PROMPTS]]
    decisions = episode_prefixes(run, backend, max(opcd.recent_episodes, 1))
    own = [d for d in decisions if set(d.episode_ids) & set(cycle.episode_ids)] or decisions
    if any(d.choices for d in own):
        own = [d for d in own if d.choices]
    turns: dict[int, list] = {}
    for d in own:
        turns.setdefault(d.episode_ids[0] if d.episode_ids else 0, []).append(d)
    ordered, depth = [], 0
    while len(ordered) < PROBE_PROMPTS and any(depth < len(t) for t in turns.values()):
        ordered += [t[depth] for _, t in sorted(turns.items()) if depth < len(t)]
        depth += 1
    return [(d.chat, d.choices) for d in ordered[:PROBE_PROMPTS]]


def _cycle_of(store, adapter):
    return next((c for c in store.cycles(adapter.run_id) if c.adapter_id == adapter.id), None)


def stored_reference(store, adapter) -> ProbeReference | None:
    """The reference stored with the cycle that trained `adapter`, if any."""
    cycle = _cycle_of(store, adapter)
    data = ((cycle.metrics or {}).get("probe") or {}).get("reference") if cycle is not None else None
    return ProbeReference.from_json(data) if data else None


def ensure_reference(run, adapter, backend, *, count=None) -> ProbeReference | None:
    """`adapter`'s probe reference: the stored one, else computed here (call it where the cycle ran, `run` its
    `agent_runtime.run.Run`) and stored with its cycle; None when no cycle trained it or there is nothing to probe
    with. `count(prompt_tokens=, generated_tokens=, decisions=)` is told the reference model's work, when it ran."""
    config, store = run.config, run.store
    found = stored_reference(store, adapter)
    cycle = _cycle_of(store, adapter)
    if found is not None or cycle is None:
        return found
    decisions = probe_decisions(run, cycle, backend)
    if not decisions:
        log.warning("adapter probe: no prompts to probe adapter %s with", adapter.name)
        return None
    parent = store.get_adapter(adapter.parent_id) if adapter.parent_id is not None else None
    reference = build_reference(
        run.model_path,
        adapter,
        parent,
        decisions,
        device=training_device(config, backend),
        shared_weights=getattr(backend, "model", None),
        count=count,
    )
    metrics = dict(store.get_cycle(cycle.id).metrics or {})
    metrics["probe"] = {"reference": reference.as_json(), "results": {}}
    store.update_cycle(cycle.id, metrics=metrics)
    return reference


def record_results(store, adapter, results: list[ProbeResult]) -> None:
    """Keep the verdicts with the cycle that trained `adapter` (the dashboard's cycle page shows them)."""
    cycle = _cycle_of(store, adapter)
    if cycle is None or not results:
        return
    metrics = dict(cycle.metrics or {})
    probe = dict(metrics.get("probe") or {})
    probe["results"] = {**(probe.get("results") or {}), **{r.where: asdict(r) for r in results}}
    metrics["probe"] = probe
    store.update_cycle(cycle.id, metrics=metrics)


def check_backend(
    reference: ProbeReference, backend, *, where: str, tolerance: float, store=None, adapter=None
) -> ProbeResult:
    """Measure and judge one backend in this process, recording the verdict (stale ones too) when given a store."""
    try:
        result = judge(reference, measure(backend, reference), where=where, tolerance=tolerance)
    except StaleAdapterError as exc:
        if store is not None:
            record_results(store, adapter, [exc.result])
        raise
    if store is not None:
        record_results(store, adapter, [result])
    return result
