"""Distillation losses for OPCD and its off-policy baseline, exact and memory-conscious.

OPCD's objective (arXiv 2602.12275; docs/architecture.md): at every response position t, with
p = softmax(logits / tau) and S_t the student's top-k token ids (picked without gradient from the student's
own tempered distribution),

    L_t = sum_{v in S_t} p_s(v) * (log p_s(v) - log p_t(v))

with the exact gradient through p_s and log p_s and the teacher held constant; the batch loss is the mean of
L_t over all response tokens of the batch (a token-level mean, not a mean of per-sequence means). With
k >= vocabulary size this is the exact reverse KL(p_s || p_t).

What happens to the mass outside S_t (`tail`) decides whether "student = teacher" is a resting point:
- "bucket" (the default): the tail is one more outcome, with mass 1 - sum_{S_t} p on each side, so L_t is the
  exact KL between the two distributions coarsened to S_t + {tail}: never negative, zero only where they agree
  on S_t and on the tail, and so at rest when the student equals the teacher;
- "renormalize": both distributions renormalised over S_t (what TRL's SDFT does): also a true KL, blind to how
  much mass the tail holds;
- "drop": the paper's sum over S_t alone. It is not a divergence: it goes below zero when the student moves
  mass from S_t into the tail, so gradient descent keeps pushing mass there (a toy student equal to its
  teacher drifted to a full KL of 0.1 in 500 steps; tests/distill/opcd/test_opcd_losses.py).

The off-policy baseline uses the forward KL on the *teacher's* top-k:
`sum_{v in T_t} p_t(v) * (log p_t(v) - log p_s(v))`, with the same three ways to treat the tail.

Memory: the log-probabilities are taken as `gather(logits) - logsumexp(logits)`, so no (B, T, V) log-softmax
tensor is materialised next to the logits. `chunked_topk_divergence` goes further: it takes final hidden
states and the output heads, and computes logits chunk by chunk along the sequence, back-propagating each
chunk into the hidden states before the next one, so that the (B, T, V) logits of the two models never
exist at once in full. The gradient is the same as the unchunked loss's. `chunked_token_loss` is that loop for
any per-chunk loss (each objective's token path, `distill.opcd.objectives`), `chunked_topk_divergence` it with
the top-k divergences.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, get_args

import torch

Divergence = Literal["reverse", "forward"]
Tail = Literal["bucket", "renormalize", "drop"]
TAILS = get_args(Tail)


def _scaled(logits: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """logits / tau in at least float32, and its log-normaliser (logsumexp over the vocabulary)."""
    scaled = (logits if logits.dtype == torch.float64 else logits.float()) / temperature
    return scaled, torch.logsumexp(scaled, dim=-1, keepdim=True)


def token_log_probs(logits: torch.Tensor, ids: torch.Tensor, temperature: float) -> torch.Tensor:
    """log softmax(logits / tau) at `ids`, in at least float32, without materialising the full log-softmax."""
    scaled, norm = _scaled(logits, temperature)
    return scaled.gather(-1, ids) - norm


_LN2 = 0.6931471805599453
_MIN_TAIL = 1e-7  # float32 cannot tell a smaller tail mass from none; flooring keeps log(tail) finite


def _log_tail(log_p: torch.Tensor) -> torch.Tensor:
    """log(1 - sum exp(log_p)) over the last axis, kept as a last column: the log-mass outside the top-k,
    computed stably (log(-expm1(x)) near x = 0, log1p(-exp(x)) below) and floored at `_MIN_TAIL`."""
    inside = torch.logsumexp(log_p, dim=-1, keepdim=True).clamp(max=float(torch.log1p(torch.tensor(-_MIN_TAIL))))
    return torch.where(
        inside > -_LN2,
        torch.log(-torch.expm1(inside.clamp(min=-_LN2))),
        torch.log1p(-torch.exp(inside.clamp(max=-_LN2))),
    )


def _with_tail(log_p: torch.Tensor, tail: str) -> torch.Tensor:
    """The top-k log-probabilities as the chosen `tail` treatment sees them (see the module docstring)."""
    if tail == "renormalize":
        return log_p - torch.logsumexp(log_p, dim=-1, keepdim=True)
    if tail == "bucket":
        return torch.cat([log_p, _log_tail(log_p)], dim=-1)
    if tail == "drop":
        return log_p
    raise ValueError(f"unknown tail treatment {tail!r}; accepted: {', '.join(TAILS)}")


def topk_divergence(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    *,
    divergence: Divergence = "reverse",
    k: int = 256,
    temperature: float = 1.0,
    tail: Tail = "bucket",
    targets: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-position top-k divergence, shape (B, T) (or the logits' leading shape), and with `targets` (B, T, 1)
    also log p_s - log p_t at those tokens (no gradient; else None).

    `divergence="reverse"`: OPCD's loss on the student's top-k. `divergence="forward"`: the forward KL on the
    teacher's top-k (the off-policy baseline). The teacher is always treated as a constant. `tail`: what the
    mass outside the top-k counts for (module docstring). The target gap comes from the same log-normalisers,
    so the sampled-token KL estimate costs no second pass over either model's logits; the loss's graph is the
    one the divergence builds alone.
    """
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(
            f"student logits {tuple(student_logits.shape)} and teacher logits "
            f"{tuple(teacher_logits.shape)} differ; both models must share the tokenizer's vocabulary"
        )
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    teacher_logits = teacher_logits.detach()
    k = min(k, student_logits.shape[-1])
    with torch.no_grad():
        source = student_logits if divergence == "reverse" else teacher_logits
        ids = source.topk(k, dim=-1).indices  # tempering is monotone: the top-k of the logits is the top-k of p
    if k == student_logits.shape[-1]:
        tail = "drop"  # no tail: the sum is the exact divergence
    if divergence not in ("reverse", "forward"):
        raise ValueError(f"unknown divergence {divergence!r}; accepted: reverse, forward")
    s_scaled, s_norm = _scaled(student_logits, temperature)
    t_scaled, t_norm = _scaled(teacher_logits, temperature)
    gap = None
    if targets is not None:
        with torch.no_grad():
            gap = (s_scaled.gather(-1, targets) - s_norm - (t_scaled.gather(-1, targets) - t_norm)).squeeze(-1)
    log_ps = _with_tail(s_scaled.gather(-1, ids) - s_norm, tail)
    log_pt = _with_tail(t_scaled.gather(-1, ids) - t_norm, tail)
    if divergence == "reverse":
        return (log_ps.exp() * (log_ps - log_pt)).sum(-1), gap
    return (log_pt.exp() * (log_pt - log_ps)).sum(-1), gap


def masked_token_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `values` over the positions where `mask` is set, across the whole batch (0 when empty)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def topk_reverse_kl(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    mask: torch.Tensor,
    *,
    k: int = 256,
    temperature: float = 1.0,
    tail: Tail = "bucket",
) -> torch.Tensor:
    """OPCD's loss: the student-top-k reverse KL, averaged over all response tokens of the batch.

    `student_logits`, `teacher_logits`: (B, T, V) at the response positions (position t predicts response
    token t); `mask`: (B, T), 1 on response tokens up to and including the first EOS.
    """
    per_token, _ = topk_divergence(
        student_logits, teacher_logits, divergence="reverse", k=k, temperature=temperature, tail=tail
    )
    return masked_token_mean(per_token, mask)


def topk_forward_kl(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    mask: torch.Tensor,
    *,
    k: int = 256,
    temperature: float = 1.0,
    tail: Tail = "bucket",
) -> torch.Tensor:
    """The off-policy baseline's loss: forward KL on the teacher's top-k, averaged over response tokens."""
    per_token, _ = topk_divergence(
        student_logits, teacher_logits, divergence="forward", k=k, temperature=temperature, tail=tail
    )
    return masked_token_mean(per_token, mask)


@dataclass(frozen=True)
class ChunkedLoss:
    """What `chunked_topk_divergence` measured: the batch loss and, for on-policy samples, the
    sampled-token estimate of the full reverse KL (mean of log p_s(y) - log p_t(y))."""

    loss: float
    sampled_kl: float
    tokens: int


Head = Callable[[torch.Tensor], torch.Tensor]
ChunkLoss = Callable[[torch.Tensor, torch.Tensor | None, torch.Tensor | None], tuple[torch.Tensor, torch.Tensor | None]]
"""A loss on one chunk of positions: (student logits (B, C, V), teacher logits (B, C, V) or None when the
teacher's head is not run, target ids (B, C, 1) or None) -> (the loss per position (B, C), log p_s - log p_t at
the targets without gradient, or None). An objective's token path (`distill.opcd.objectives`)."""


def chunked_token_loss(
    student_hidden: torch.Tensor,
    teacher_hidden: torch.Tensor | None,
    mask: torch.Tensor,
    *,
    student_head: Head,
    teacher_head: Head | None,
    loss: ChunkLoss,
    targets: torch.Tensor | None = None,
    chunk_size: int = 128,
    backward: bool = True,
) -> ChunkedLoss:
    """The token-mean of `loss` over (B, T) response positions, computed `chunk_size` positions at a time.

    `student_hidden`, `teacher_hidden`: final hidden states (B, T, H) at the response positions; the heads map
    them to logits (with `teacher_head` None the teacher is not run and `loss` gets None for its logits). When
    `backward` is set and `student_hidden` requires grad, each chunk's share of the loss is back-propagated into
    the hidden states (and the student head) as soon as it is computed, then the accumulated hidden-state
    gradient is pushed through the rest of the student in one call, so only one chunk of logits per model is
    alive at a time. Where `loss` returns the target gap (on-policy samples), its token-mean is the sampled-token
    estimate of the full reverse KL.
    """
    assert student_hidden.shape[:2] == mask.shape, (student_hidden.shape, mask.shape)
    tokens = int(mask.sum().item())
    normaliser = max(tokens, 1)
    grad_wanted = backward and student_hidden.requires_grad and torch.is_grad_enabled()
    leaf = student_hidden.detach().requires_grad_(grad_wanted)
    loss_total, kl_total = 0.0, 0.0
    for start in range(0, student_hidden.shape[1], chunk_size):
        span = slice(start, start + chunk_size)
        chunk_mask = mask[:, span].float()
        if not chunk_mask.any():
            continue
        # A (B, chunk, H) slice of a (B, T, H) tensor is not contiguous over its batch: matmul then broadcasts the
        # head's (H, V) weight to (B, H, V) and copies it for a bmm (V x H x B values a chunk, ~450 MB for B = 4 on
        # SmolLM2 in float32) instead of folding the rows into one mm. A contiguous chunk is folded.
        with torch.set_grad_enabled(grad_wanted):
            s_logits = student_head(leaf[:, span].contiguous())
            t_logits = None
            if teacher_head is not None:
                with torch.no_grad():
                    t_logits = teacher_head(teacher_hidden[:, span].contiguous())
            per_token, gap = loss(s_logits, t_logits, None if targets is None else targets[:, span, None])
            if gap is not None:
                kl_total += (gap * chunk_mask).sum().item() / normaliser
            chunk_loss = (per_token * chunk_mask).sum() / normaliser
            if grad_wanted:
                chunk_loss.backward()
        loss_total += chunk_loss.item()
        del s_logits, t_logits, per_token
    if grad_wanted:
        student_hidden.backward(leaf.grad)
    return ChunkedLoss(loss=loss_total, sampled_kl=kl_total, tokens=tokens)


def chunked_topk_divergence(
    student_hidden: torch.Tensor,
    teacher_hidden: torch.Tensor,
    mask: torch.Tensor,
    *,
    student_head: Head,
    teacher_head: Head,
    targets: torch.Tensor | None = None,
    divergence: Divergence = "reverse",
    k: int = 256,
    temperature: float = 1.0,
    tail: Tail = "bucket",
    chunk_size: int = 128,
    backward: bool = True,
) -> ChunkedLoss:
    """`topk_divergence`'s token-mean in chunks (`chunked_token_loss`); `targets` (the response token ids) also
    give the sampled-token KL estimate. With k >= vocabulary and `divergence="reverse"` it is the exact KL that
    evaluation measures."""

    def loss(s_logits, t_logits, chunk_targets):
        return topk_divergence(
            s_logits, t_logits, divergence=divergence, k=k, temperature=temperature, tail=tail, targets=chunk_targets
        )

    return chunked_token_loss(
        student_hidden,
        teacher_hidden,
        mask,
        student_head=student_head,
        teacher_head=teacher_head,
        loss=loss,
        targets=targets,
        chunk_size=chunk_size,
        backward=backward,
    )
