"""Policy backends: batched transformers generation with logprobs and LoRA switching, the chat backend on
langchain-core's own fake chat model, and clear errors for vLLM without vLLM and CUDA without a GPU."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from agent_runtime.config import ModelConfig
from agent_runtime.llm import BackendError, SamplingParams, make_backend
from agent_runtime.llm.chat_backend import ChatBackend


def chats(n):
    return [
        [{"role": "system", "content": "Play."}, {"role": "user", "content": "go north " * (i + 1)}] for i in range(n)
    ]


def test_batched_generation_matches_one_by_one(tiny_backend):
    params = SamplingParams(max_new_tokens=6, temperature=0.0)
    batch = tiny_backend.generate(chats(3), params)
    single = [tiny_backend.generate([c], params)[0] for c in chats(3)]
    assert [c.token_ids for c in batch] == [c.token_ids for c in single]  # left padding changes nothing
    assert [c.prompt_tokens for c in batch] == [c.prompt_tokens for c in single]
    assert all(c.completion_tokens == len(c.token_ids) > 0 for c in batch)


def test_logprobs_are_the_sampled_tokens_logprobs(tiny_backend):
    [out] = tiny_backend.generate(chats(1), SamplingParams(max_new_tokens=5, temperature=0.0, logprobs=True))
    assert len(out.logprobs) == len(out.token_ids)
    model, tok = tiny_backend.model, tiny_backend.tokenizer
    ids = tok(out.prompt_text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    full = torch.cat([ids, torch.tensor([out.token_ids])], dim=1)
    with torch.no_grad():
        logits = model(full).logits[0, ids.shape[1] - 1 : -1].log_softmax(-1)
    expected = logits.gather(-1, torch.tensor(out.token_ids)[:, None]).squeeze(-1)
    assert torch.allclose(torch.tensor(out.logprobs), expected, atol=1e-4)


def test_seeded_sampling_repeats(tiny_backend):
    params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=7)
    assert [c.token_ids for c in tiny_backend.generate(chats(2), params)] == [
        c.token_ids for c in tiny_backend.generate(chats(2), params)
    ]


def test_lora_adapters_load_and_switch(tmp_path, tiny_model_dir):
    from peft import LoraConfig, get_peft_model

    from agent_runtime.llm.transformers_backend import TransformersBackend
    from agent_runtime.testing import tiny_model_and_tokenizer

    model, _ = tiny_model_and_tokenizer()
    peft_model = get_peft_model(
        model, LoraConfig(r=4, target_modules=["q_proj", "v_proj", "o_proj"], init_lora_weights=False)
    )
    peft_model.save_pretrained(tmp_path / "adapter")
    backend = TransformersBackend.from_pretrained(str(tiny_model_dir), dtype="float32")
    params = SamplingParams(max_new_tokens=6, temperature=0.0, logprobs=True)
    base = backend.generate(chats(1), params)[0]
    backend.load_adapter("a1", tmp_path / "adapter")
    tuned = backend.generate(chats(1), params)[0]
    backend.use_adapter(None)
    again = backend.generate(chats(1), params)[0]
    assert again.token_ids == base.token_ids and again.logprobs == pytest.approx(base.logprobs, abs=1e-5)
    assert tuned.logprobs != pytest.approx(base.logprobs, abs=1e-3)  # the adapter changes the policy
    with pytest.raises(BackendError, match="unknown adapter 'nope'; loaded: a1"):
        backend.use_adapter("nope")
    with pytest.raises(BackendError, match="adapter_config.json missing"):
        backend.load_adapter("bad", tmp_path)
    # any name: peft refuses '.' in its module names, so "run.v2" and "run_v2" are kept apart under other keys
    backend.use_adapter("a1")
    fingerprint = backend.adapter_fingerprint()
    assert fingerprint is not None
    backend.load_adapter("run.v2", tmp_path / "adapter")
    assert backend.generate(chats(1), params)[0].logprobs == pytest.approx(tuned.logprobs, abs=1e-5)
    assert backend.adapter_fingerprint() == fingerprint
    backend.load_adapter("run_v2", tmp_path / "adapter")
    assert backend.active_adapter == "run_v2" and set(backend.adapters) == {"a1", "run.v2", "run_v2"}
    assert len(set(backend.model.peft_config)) == 3


def test_auto_dtype_is_float32_on_every_device(tiny_model_dir):
    # bf16 acting rounded away most of a small OPCD adapter's gain (bench/RESULTS.md "Acting in bfloat16"), so
    # `auto` never picks it, on a CPU with native bf16 or on a GPU; `bfloat16` asked for by name still works
    from agent_runtime.llm.transformers_backend import TransformersBackend, auto_dtype

    assert auto_dtype(torch.device("cuda")) == torch.float32 and auto_dtype(torch.device("cpu")) == torch.float32
    backend = TransformersBackend.from_pretrained(str(tiny_model_dir), dtype="auto")
    assert {p.dtype for p in backend.model.parameters()} == {torch.float32}
    asked = TransformersBackend.from_pretrained(str(tiny_model_dir), dtype="bfloat16")
    assert {p.dtype for p in asked.model.parameters()} == {torch.bfloat16}


def test_chat_backend_with_fake_chat_model():
    from langchain_core.language_models.fake_chat_models import FakeListChatModel

    backend = ChatBackend(FakeListChatModel(responses=["take coin", "go north STOP ignored"]))
    out = backend.generate(chats(2), SamplingParams(stop=("STOP",)))
    assert [c.text for c in out] == ["take coin", "go north "]
    assert all(c.prompt_tokens > 0 and c.completion_tokens > 0 and c.logprobs is None for c in out)
    assert backend.stats.calls == 1 and backend.stats.completions == 2


def test_chat_backend_from_config():
    config = ModelConfig(
        name="fake",
        backend="chat",
        options={
            "class": "langchain_core.language_models.fake_chat_models:FakeListChatModel",
            "kwargs": {"responses": ["look"]},
        },
    )
    backend = make_backend(config)
    assert backend.generate(chats(1), SamplingParams())[0].text == "look"
    with pytest.raises(BackendError, match="is not a langchain-core BaseChatModel"):
        make_backend(ModelConfig(name="x", backend="chat", options={"class": "collections:OrderedDict"}))
    with pytest.raises(BackendError, match="options.class"):
        make_backend(ModelConfig(name="x", backend="chat"))


def test_vllm_backend_fails_clearly_without_vllm():
    try:
        import vllm  # noqa: F401

        pytest.skip("vllm is installed here")
    except ImportError:
        pass
    with pytest.raises(BackendError, match=r"vLLM.*not installed.*gpu"):
        make_backend(ModelConfig(name="smollm2-135m-instruct", backend="vllm"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_cuda_without_gpu_is_a_clear_error(tiny_model_dir):
    with pytest.raises(BackendError, match="no CUDA GPU is available"):
        make_backend(ModelConfig(name=str(tiny_model_dir), device="cuda"))


def test_transformers_options_reach_the_backend(tiny_model_dir):
    options = {"prefix_cache": False, "choice_batch_mb": 32}
    backend = make_backend(ModelConfig(name=str(tiny_model_dir), options=options))
    assert backend.prefix_cache is False and backend.choice_batch_bytes == 32 * 2**20
    # a misspelt option is refused where the config is read, before any weights load
    with pytest.raises(
        ValidationError, match="prefix_cahe: unknown option; accepted: choice_batch_mb, min_shared_prefix, prefix_cache"
    ):
        ModelConfig(name=str(tiny_model_dir), options={"prefix_cahe": False})
    with pytest.raises(ValidationError, match="choice_batch_mb"):  # a bound no forward fits in
        ModelConfig(name=str(tiny_model_dir), options={"choice_batch_mb": 0})


def test_sampled_logprobs_are_those_of_the_tempered_distribution(tiny_backend):
    params = SamplingParams(max_new_tokens=5, temperature=0.8, logprobs=True, seed=11)
    [out] = tiny_backend.generate(chats(1), params)
    prompt = tiny_backend.tokenizer(out.prompt_text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    ids = torch.cat([prompt, torch.tensor([out.token_ids])], dim=1)
    with torch.no_grad():
        logits = tiny_backend.model(ids).logits[0, prompt.shape[1] - 1 : -1].float()
    expected = (logits / 0.8).log_softmax(-1).gather(-1, torch.tensor(out.token_ids)[:, None]).squeeze(-1)
    assert torch.allclose(torch.tensor(out.logprobs), expected, atol=1e-4)
