"""Which adapter acted: the fingerprint a backend reports of the LoRA weights it loaded, and the probe after a
promotion that stops a run whose acting backend does not compute with the promoted adapter.

The adapters are random LoRAs on a tiny model whose embeddings are scaled up (the stock tiny model's logits are
too small for any adapter to move its choice distributions far); a stale
backend is the real transformers backend behind a wrapper whose `use_adapter` and `load_adapter` do not reach the
model (the failure reported for asynchronous LoRA updates: the worker keeps the old weights), or one that loaded
another adapter's files. The loop and Ray tests are in tests/agent_runtime/phases/test_probe_runs.py.
"""

from __future__ import annotations

import math
import shutil
from types import SimpleNamespace

import pytest
import torch

from agent_runtime.llm.base import FingerprintBackend, SamplingParams, activate
from agent_runtime.llm.transformers_backend import TransformersBackend
from agent_runtime.phases.probe import (
    FLOAT32_TOLERANCE,
    LOW_PRECISION_TOLERANCE,
    ProbeReference,
    StaleAdapterError,
    build_reference,
    check_backend,
    choice_distance,
    judge,
    measure,
)
from agent_runtime.testing import StaleAdapterBackend
from modelkit.fingerprint import fingerprint_files, fingerprint_state

GAME = "You play a text adventure game. Reply with exactly one of the admissible actions."
ACTIONS = ["go north", "take coin", "look", "inventory"]
ROOMS = ["Kitchen", "Hall", "Cellar", "Garden"]
DECISIONS = [
    (
        [
            {"role": "system", "content": GAME},
            {
                "role": "user",
                "content": f"-= {room} =-\nThere is a coin on the floor.\nAdmissible actions: " + " | ".join(ACTIONS),
            },
        ],
        ACTIONS,
    )
    for room in ROOMS
]


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    """The tiny model with its (tied) embeddings scaled 20x: logits large enough for sure choices."""
    from agent_runtime.testing import tiny_model_and_tokenizer

    model, tokenizer = tiny_model_and_tokenizer()
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(20.0)
    directory = tmp_path_factory.mktemp("peaky-tiny")
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def random_adapter(tiny_model_dir, path, *, seed: int, scale: float = 0.5):
    """A LoRA on the tiny model whose A and B matrices are random (so it changes the model), saved at `path`."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    lora = get_peft_model(
        model,
        LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "o_proj", "down_proj"]),
    )
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in lora.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * scale)
    lora.save_pretrained(path)
    return path


def adapter_info(path, *, id_: int, name: str, fingerprint=None):
    return SimpleNamespace(id=id_, name=name, path=str(path), fingerprint=fingerprint)


@pytest.fixture(scope="module")
def adapters(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("probe-adapters")
    return {
        name: random_adapter(tiny_model_dir, root / name, seed=seed)
        for name, seed in (("parent", 1), ("new", 2), ("other", 3))
    }


@pytest.fixture(scope="module")
def reference(tiny_model_dir, adapters) -> ProbeReference:
    new = adapter_info(adapters["new"], id_=2, name="cycle-2", fingerprint=fingerprint_files(adapters["new"]))
    parent = adapter_info(adapters["parent"], id_=1, name="cycle-1")
    return build_reference(str(tiny_model_dir), new, parent, DECISIONS)


def acting(tiny_model_dir, *paths, dtype: str = "float32") -> TransformersBackend:
    backend = TransformersBackend.from_pretrained(str(tiny_model_dir), dtype=dtype)
    for i, path in enumerate(paths):
        backend.load_adapter(f"a{i}", path)
    return backend


# -- the fingerprint ---------------------------------------------------------------------------------------------
def test_the_transformers_backend_fingerprints_what_its_model_holds(tiny_model_dir, adapters):
    backend = acting(tiny_model_dir)
    assert isinstance(backend, FingerprintBackend) and backend.adapter_fingerprint() is None, "the base model"
    backend.load_adapter("parent", adapters["parent"])
    backend.load_adapter("new", adapters["new"])
    files = {name: fingerprint_files(adapters[name]) for name in ("parent", "new", "other")}
    assert len(set(files.values())) == 3 and all(len(f) == 64 for f in files.values())
    assert backend.adapter_fingerprint() == files["new"], "the tensors in the model are the trainer's files"
    backend.use_adapter("parent")
    assert backend.adapter_fingerprint() == files["parent"]
    backend.use_adapter(None)
    assert backend.adapter_fingerprint() is None
    # what peft has active is what is reported, not what the backend was told
    backend.use_adapter("new")
    backend.model.set_adapter("parent")
    assert backend.adapter_fingerprint() == files["parent"]


def test_the_fingerprint_is_the_same_in_bfloat16_and_from_any_stored_dtype(tiny_model_dir, adapters, tmp_path):
    from safetensors.torch import load_file, save_file

    backend = acting(tiny_model_dir, adapters["new"], dtype="bfloat16")
    assert backend.adapter_fingerprint() == fingerprint_files(adapters["new"]), "peft keeps float32 LoRA weights"
    tensors = load_file(str(adapters["new"] / "adapter_model.safetensors"))
    halved = shutil.copytree(adapters["new"], tmp_path / "bf16")
    save_file({k: v.to(torch.bfloat16) for k, v in tensors.items()}, str(halved / "adapter_model.safetensors"))
    rounded = {k: v.to(torch.bfloat16).float() for k, v in tensors.items()}
    assert fingerprint_files(halved) == fingerprint_state(rounded), "bfloat16 widens to float32 exactly"
    assert fingerprint_files(halved) != fingerprint_files(adapters["new"]), "and rounding is a change"
    renamed = {k.replace("q_proj", "k_proj"): v for k, v in tensors.items()}
    assert fingerprint_state(renamed) != fingerprint_state(tensors), "names are part of it"


# -- the probe ---------------------------------------------------------------------------------------------------
def test_the_reference_moves_from_the_parent(reference):
    assert reference.choices == [ACTIONS] * 4 and len(reference.prompts) == 4
    assert reference.shift > 4 * FLOAT32_TOLERANCE, reference.shift
    for logprobs in reference.adapter_logprobs + reference.parent_logprobs:
        assert abs(sum(math.exp(x) for x in logprobs) - 1) < 1e-5
    assert [len(r) for r in reference.greedy] == [2] * 4
    assert ProbeReference.from_json(reference.as_json()) == reference, "it is stored as JSON"


def test_a_backend_with_the_adapter_passes(tiny_model_dir, adapters, reference):
    backend = acting(tiny_model_dir, adapters["parent"], adapters["new"])
    result = check_backend(reference, backend, where="the loop's backend", tolerance=FLOAT32_TOLERANCE)
    assert result.verdict == "adapter" and result.mode == "choice"
    assert result.to_adapter < 1e-4 < reference.shift - FLOAT32_TOLERANCE < result.to_parent
    assert result.fingerprint == result.expected_fingerprint == fingerprint_files(adapters["new"])


def test_a_bfloat16_backend_with_the_adapter_passes_at_its_tolerance(tiny_model_dir, adapters, reference):
    backend = acting(tiny_model_dir, adapters["new"], dtype="bfloat16")
    result = check_backend(reference, backend, where="bf16", tolerance=LOW_PRECISION_TOLERANCE)
    assert result.verdict == "adapter" and 0 < result.to_adapter < LOW_PRECISION_TOLERANCE


def test_a_backend_that_did_not_switch_stops_the_run(tiny_model_dir, adapters, reference):
    backend = StaleAdapterBackend(acting(tiny_model_dir, adapters["parent"]))
    activate(backend, adapter_info(adapters["new"], id_=2, name="cycle-2"))
    assert backend.active_adapter == "cycle-2", "it says it switched"
    with pytest.raises(
        StaleAdapterError,
        match=r"rollout worker 3 does not act with adapter cycle-2 after its "
        r"promotion: it acts as the parent",
    ) as caught:
        check_backend(reference, backend, where="rollout worker 3", tolerance=FLOAT32_TOLERANCE)
    result = caught.value.result
    assert result.to_parent < 1e-4 and result.to_adapter > 2 * FLOAT32_TOLERANCE
    assert result.fingerprint == fingerprint_files(adapters["parent"]) != result.expected_fingerprint
    assert f"to the parent {result.to_parent:.4f}" in str(caught.value)


def test_a_backend_that_loaded_other_files_stops_the_run(tiny_model_dir, adapters, reference):
    backend = acting(tiny_model_dir, adapters["other"])
    with pytest.raises(StaleAdapterError, match="acts as neither the adapter nor its parent"):
        check_backend(reference, backend, where="vllm engine", tolerance=FLOAT32_TOLERANCE)


def test_an_adapter_that_barely_moved_is_inconclusive_not_an_error(tiny_model_dir, adapters):
    same = adapter_info(adapters["new"], id_=2, name="cycle-2")
    reference = build_reference(
        str(tiny_model_dir), same, adapter_info(adapters["new"], id_=1, name="cycle-1"), DECISIONS[:2]
    )
    assert reference.shift < 1e-6
    result = check_backend(
        reference, acting(tiny_model_dir, adapters["parent"]), where="w", tolerance=FLOAT32_TOLERANCE
    )
    assert result.verdict == "inconclusive" and "too little" in result.note


class NoDistribution:
    """A backend that chooses without a distribution (as the chat backend does), over a real model."""

    name = "chat"

    def __init__(self, inner):
        self.inner = inner

    def choose(self, prompts, choices, params):
        out = self.inner.choose(prompts, choices, params)
        for completion in out:
            completion.choice_logprobs = None
        return out

    def generate(self, prompts, params):
        return self.inner.generate(prompts, params)


def test_without_a_choice_distribution_the_greedy_replies_are_probed(tiny_model_dir, adapters, reference):
    right = measure(NoDistribution(acting(tiny_model_dir, adapters["new"])), reference)
    assert right.mode == "greedy" and len(right.replies) == 4
    result = judge(reference, right, where="server", tolerance=FLOAT32_TOLERANCE)
    assert result.verdict in ("adapter", "inconclusive") and result.to_adapter < 1e-4
    stale = measure(NoDistribution(acting(tiny_model_dir, adapters["parent"])), reference)
    assert any(a.text != p.text for a, p in reference.greedy), "the policies' greedy replies differ somewhere"
    with pytest.raises(StaleAdapterError, match="server does not act with adapter cycle-2"):
        judge(reference, stale, where="server", tolerance=FLOAT32_TOLERANCE)


def test_a_backend_with_no_log_probabilities_is_reported_unverifiable(reference):
    class Blind:
        name = "chat"

        def generate(self, prompts, params):
            from agent_runtime.llm.base import Completion

            return [Completion(text="look", token_ids=[], prompt_tokens=1) for _ in prompts]

    result = judge(reference, measure(Blind(), reference), where="server", tolerance=LOW_PRECISION_TOLERANCE)
    assert result.verdict == "unverifiable" and "neither a choice distribution nor log-probabilities" in result.note


def test_distances_are_total_variation_in_probability():
    sure, unsure = [[0.0, -50.0]], [[math.log(0.5), math.log(0.5)]]
    assert choice_distance(sure, unsure) == pytest.approx(0.5)
    assert choice_distance([[0.0, -50.0]], [[0.0, -20.0]]) < 1e-8, "the numerics of excluded actions do not count"


def test_choice_prompts_are_generated_for_only_where_kept(tiny_model_dir, adapters, monkeypatch):
    """Of many choice-mode candidates, the reference generates greedy replies only for the PROBE_PROMPTS it keeps
    (the action set needs no generated candidates); a free-mode prompt's candidates are still generated, and
    every kept prompt's greedy replies are each policy's own greedy reply."""
    from agent_runtime.phases.probe import CANDIDATE_PROMPTS, PROBE_PROMPTS

    rooms = [f"Room {i}" for i in range(CANDIDATE_PROMPTS - 1)]
    choice = [
        (
            [{"role": "system", "content": GAME}, {"role": "user", "content": f"-= {room} =-\nA coin lies here."}],
            ACTIONS,
        )
        for room in rooms
    ]
    free = ([{"role": "system", "content": GAME}, {"role": "user", "content": "-= Attic =-\nWhat now?"}], None)
    generated: list[int] = []
    real = TransformersBackend.generate

    def counting(self, prompts, params):
        generated.append(len(prompts))
        return real(self, prompts, params)

    monkeypatch.setattr(TransformersBackend, "generate", counting)
    new = adapter_info(adapters["new"], id_=2, name="cycle-2", fingerprint=fingerprint_files(adapters["new"]))
    parent = adapter_info(adapters["parent"], id_=1, name="cycle-1")
    reference = build_reference(str(tiny_model_dir), new, parent, [*choice, free])
    monkeypatch.setattr(TransformersBackend, "generate", real)

    assert len(reference.prompts) == PROBE_PROMPTS
    # the free prompt: greedy under both policies and two samples; then at most the kept choice prompts, twice
    assert generated[:3] == [1, 1, 2] and sum(generated[3:]) <= 2 * PROBE_PROMPTS, generated
    assert sum(generated) < 2 * CANDIDATE_PROMPTS, "not every candidate was generated for"
    check = acting(tiny_model_dir, adapters["parent"], adapters["new"])
    for policy, index in (("a1", 0), ("a0", 1)):
        check.use_adapter(policy)
        again = check.generate(reference.prompts, SamplingParams(max_new_tokens=8, temperature=0.0))
        assert [r[index].text for r in reference.greedy] == [c.text for c in again]


def test_the_reference_tells_a_profile_the_work_its_own_model_did(tiny_model_dir, adapters):
    """The reference runs a model the acting backend's counters never see; a profile row is told its tokens, so the
    probe's row is set against the floor of the work it really did (bench/loop.py)."""
    from agent_runtime.state.profile import PhaseTime

    row = PhaseTime()
    new = adapter_info(adapters["new"], id_=2, name="cycle-2")
    parent = adapter_info(adapters["parent"], id_=1, name="cycle-1")
    reference = build_reference(str(tiny_model_dir), new, parent, DECISIONS, count=row.count)
    # every candidate scored under both policies, then the kept prompts' greedy replies generated and scored
    assert row.decisions >= 2 * len(DECISIONS) + 2 * len(reference.prompts)
    from transformers import AutoTokenizer

    from modelkit.chat_tokens import encode_chat

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompts = [len(encode_chat(tokenizer, chat).ids) for chat, _ in DECISIONS]
    assert row.prompt_tokens >= 2 * sum(prompts)  # each prompt scored under the adapter and under its parent
    replies = sum(len(r.token_ids) for pair in reference.greedy for r in pair)
    assert replies > 0 and row.generated_tokens >= replies
