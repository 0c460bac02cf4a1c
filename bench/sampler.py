"""Where free-text OPCD's sampling time per token goes: `generate` against a lean decode loop
and against the model's own forward, in the dtype OPCD's sampler uses (`--dtype auto`: as `opcd.sampler: auto`).

    .venv/bin/python bench/sampler.py                       # SmolLM2-135M, batch 4, 64 new tokens, 1 and 2 threads
    .venv/bin/python bench/sampler.py --prompt-tokens 600 --dtype float32

Rows, each the best of `--repeat` runs, in ms per decoded token (the prompt's prefill is timed apart):
- `generate`: what `modelkit.sampler.sample_responses` calls (ancestral sampling, top_k=0, the dynamic cache);
- `generate, static cache`: the same with `cache_implementation="static"` (a preallocated cache, no compile);
- `lean loop`: the same sampling written as a plain loop (one forward with the dynamic cache, a softmax and a
  multinomial per step; no logits processors, stopping criteria or per-step bookkeeping);
- `lean loop, static cache`: the loop over a preallocated static cache;
- `forward floor`: one decode forward of the batch at the cache's middle length, nothing else (the model's time);
- `generate, packed` and `forward, packed`: the same with the linear layers computing from packed weights, as
  OPCD's merged sampler does in bf16 on a CPU with native bf16 (`modelkit.sampler.pack_linears`; blank where
  it does not pack); `OPCD's lean decode, packed`: what OPCD's merged sampler runs there
  (`modelkit.decode.lean_generate` with the inverse-CDF draw);
- `weight read`: the time to stream the model's weights once from memory (a sum over every parameter), the floor
  of a decode step that is bound by memory rather than compute.
If `generate` is near the forward floor, per-token overhead is not where the time goes, and a leaner loop cannot
make sampling much faster; the model's forward at this batch (the weights read once per token) can.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def measure(model, batch: int, prompt_tokens: int, new_tokens: int, repeat: int) -> dict[str, float]:
    import torch
    from transformers import StaticCache

    from modelkit.decode import lean_decoding_supported, lean_generate
    from modelkit.sampler import InverseCDFSampler, pack_linears, packs_bf16_linears

    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(100, vocab - 100, (batch, prompt_tokens), generator=generator)
    mask = torch.ones_like(ids)
    out: dict[str, float] = {}

    @torch.no_grad()
    def prefill():
        model(input_ids=ids, attention_mask=mask, use_cache=True)

    prefill()  # warm-up: the first call of a shape builds its kernels
    out["prefill"] = best(prefill, repeat)

    @torch.no_grad()
    def generate(cache: str | None = None):
        model.generate(
            cache_implementation=cache,
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            temperature=0.7,
            top_k=0,
            top_p=1.0,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            pad_token_id=0,
        )

    @torch.no_grad()
    def lean(static: bool):
        cache = StaticCache(config=model.config, max_cache_len=prompt_tokens + new_tokens) if static else None
        position = torch.arange(prompt_tokens)
        result = model(input_ids=ids, past_key_values=cache, use_cache=True, cache_position=position)
        cache = result.past_key_values
        logits = result.logits[:, -1]
        for step in range(new_tokens):
            probs = (logits.float() / 0.7).softmax(-1)
            token = torch.multinomial(probs, 1, generator=generator)
            position = torch.tensor([prompt_tokens + step])
            result = model(input_ids=token, past_key_values=cache, use_cache=True, cache_position=position)
            logits = result.logits[:, -1]

    @torch.no_grad()
    def opcd_decode():  # what OPCD's merged sampler runs: the lean loop, drawing with the inverse CDF
        draw = InverseCDFSampler(0.7)
        lean_generate(model, ids, mask, draw=draw.sample, max_new_tokens=new_tokens, eos_ids=[-1], pad_id=0)

    def per_token(name: str, run) -> None:
        """ms a decoded token of `run` (the prefill taken off); NaN where a static cache does not take the call."""
        try:
            out[name] = (best(run, repeat) - out["prefill"]) / new_tokens
        except (TypeError, ValueError, RuntimeError) as exc:
            print(f"{name}: {type(exc).__name__}: {exc}", file=sys.stderr)
            out[name] = float("nan")

    per_token("generate", generate)
    per_token("generate_static", lambda: generate("static"))
    per_token("lean", lambda: lean(False))
    per_token("lean_static", lambda: lean(True))
    out["forward"] = decode_forward(model, batch, prompt_tokens + new_tokens // 2, repeat)
    out["generate_packed"] = out["forward_packed"] = out["lean_decode_packed"] = float("nan")
    if packs_bf16_linears(model.dtype, model.device):  # what OPCD's merged sampler computes with on this CPU
        weights = [(param, param.data) for param in model.parameters()]  # packing empties the plain copies
        packed = pack_linears(model)
        try:
            out["prefill_packed"] = best(prefill, repeat)
            out["generate_packed"] = (best(generate, repeat) - out["prefill_packed"]) / new_tokens
            if lean_decoding_supported(model):
                out["lean_decode_packed"] = (best(opcd_decode, repeat) - out["prefill_packed"]) / new_tokens
            out["forward_packed"] = decode_forward(model, batch, prompt_tokens + new_tokens // 2, repeat)
        finally:
            for module in packed:
                del module.forward
            for param, data in weights:
                param.data = data
    params = list(model.parameters())
    out["weights_mb"] = sum(p.numel() * p.element_size() for p in params) / 2**20
    out["read"] = best(lambda: [p.sum() for p in params], max(3, repeat))
    return out


def decode_forward(model, batch: int, middle: int, repeat: int) -> float:
    """The median time of one decode forward of `batch` rows over a cache of `middle` tokens."""
    import torch

    vocab = model.config.vocab_size
    with torch.no_grad():
        cached = model(input_ids=torch.randint(100, vocab - 100, (batch, middle)), use_cache=True).past_key_values
        token = torch.randint(100, vocab - 100, (batch, 1))
        steps = []
        for _ in range(max(8, repeat * 4)):
            if cached.get_seq_length() > middle:
                cached.crop(middle - cached.get_seq_length())
            started = time.perf_counter()
            model(input_ids=token, past_key_values=cached, use_cache=True)
            steps.append(time.perf_counter() - started)
    return statistics.median(steps)


def main(argv: list[str] | None = None) -> int:
    import torch
    from transformers import AutoModelForCausalLM

    from agent_runtime.checkpoints import resolve_model

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--dtype", default="auto", choices=("auto", "bfloat16", "float32"), help="auto: as OPCD's sampler")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--prompt-tokens", type=int, default=300)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--threads", default="1,2")
    p.add_argument("--repeat", type=int, default=2)
    args = p.parse_args(argv)
    from modelkit.sampler import sampler_dtype

    dtype = sampler_dtype("auto", "cpu") if args.dtype == "auto" else getattr(torch, args.dtype)
    model = AutoModelForCausalLM.from_pretrained(resolve_model(args.model), dtype=dtype).eval()
    rows = []
    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads)
        r = measure(model, args.batch, args.prompt_tokens, args.new_tokens, args.repeat)
        rows.append((threads, r))
        print(f"{threads} thread(s): {r}", file=sys.stderr, flush=True)
    print(
        f"\n{args.model}, {str(dtype).removeprefix('torch.')}, batch {args.batch}, {args.prompt_tokens}-token prompts, "
        f"{args.new_tokens} new tokens; weights {rows[0][1]['weights_mb']:.0f} MB\n"
    )
    columns = [  # (header, key): ms per token except the prefill
        ("generate ms/token", "generate"),
        ("generate, static cache", "generate_static"),
        ("lean loop", "lean"),
        ("lean loop, static cache", "lean_static"),
        ("forward floor", "forward"),
        ("generate, packed", "generate_packed"),
        ("forward, packed", "forward_packed"),
        ("OPCD's lean decode, packed", "lean_decode_packed"),
        ("weight read", "read"),
    ]
    print("| threads | prefill s | prefill s, packed | " + " | ".join(h for h, _ in columns) + " |")
    print("|---:" * (len(columns) + 3) + "|")
    for threads, r in rows:
        print(
            f"| {threads} | {r['prefill']:.2f} | {r.get('prefill_packed', float('nan')):.2f} | "
            + " | ".join(f"{1000 * r[k]:.1f}" for _, k in columns)
            + " |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
