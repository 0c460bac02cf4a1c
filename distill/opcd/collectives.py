"""The data-parallel collectives of OPCD training: what every rank of a `torch.distributed` group must agree on.

`OPCDTrainer` (see its module docstring) splits each global batch into contiguous shares, one per rank. Two
things must then be global: the loss the divergence guard sees (so every rank takes the same decision) and
the gradient the optimizer steps with. A rank's loss and gradient are token means over its own share, so
both are combined weighted by each rank's tokens: N ranks compute exactly the single-process result even
when their shares sampled responses of different lengths. Plain functions over an initialised process
group, kept apart from the trainer so that the training step reads as one algorithm.

Each rank takes its contiguous share of every global batch (the union is exactly the single-process batch) and
samples with its own seed. This is an explicit all-reduce rather than a DistributedDataParallel wrapper because
the student is run through its decoder stack and output head separately and back-propagated chunk by chunk
(several `backward` calls per step, with gradient checkpointing), which DDP's one-forward-one-backward reducer
does not support. `evaluate_kl` gives the same value on every rank (the evaluation batches are dealt out to the
ranks and the per-prompt values summed), equal to the single-process value.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch


def world() -> tuple[int, int]:
    """(rank, number of ranks) of the initialised torch.distributed group; (0, 1) outside one."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def buckets(params: list[torch.nn.Parameter], limit: int = 1 << 25) -> Iterator[list[torch.nn.Parameter]]:
    """Parameters grouped by dtype and device into buckets of about `limit` elements, for one all-reduce
    each (hundreds of tiny LoRA tensors would otherwise cost one round trip apiece)."""
    groups: dict[tuple, list[torch.nn.Parameter]] = {}
    for param in params:
        groups.setdefault((param.dtype, param.device), []).append(param)
    for group in groups.values():
        bucket, size = [], 0
        for param in group:
            bucket.append(param)
            size += param.numel()
            if size >= limit:
                yield bucket
                bucket, size = [], 0
        if bucket:
            yield bucket


def global_loss(result, device: torch.device) -> tuple[float, float, int]:
    """(loss, sampled KL, tokens) of the global batch: the ranks' token means, weighted by their tokens.
    `result` is this rank's `ChunkedLoss`, or None when its share of the batch was empty."""
    local = (
        [0.0, 0.0, 0.0]
        if result is None
        else [result.tokens, result.loss * result.tokens, result.sampled_kl * result.tokens]
    )
    totals = torch.tensor(local, dtype=torch.float64, device=device)
    torch.distributed.all_reduce(totals)
    tokens = int(totals[0].item())
    return totals[1].item() / max(tokens, 1), totals[2].item() / max(tokens, 1), tokens


@torch.no_grad()
def average_gradients(params: list[torch.nn.Parameter], local_tokens: int, global_tokens: int) -> None:
    """Turn every rank's gradient (of its own token mean) into the gradient of the global token mean:
    sum over ranks of (local tokens / global tokens) x local gradient, the same on every rank."""
    weight = local_tokens / max(global_tokens, 1)
    for bucket in buckets(params):
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in bucket]).mul_(
            weight
        )
        torch.distributed.all_reduce(flat)
        offset = 0
        for param in bucket:
            param.grad = flat[offset : offset + param.numel()].view_as(param)
            offset += param.numel()
