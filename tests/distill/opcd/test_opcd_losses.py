"""The OPCD losses against a direct float64 computation: values, gradients, the k = V limit, chunking."""

from __future__ import annotations

import functools

import pytest
import torch

from distill.opcd.losses import chunked_token_loss, chunked_topk_divergence, topk_forward_kl, topk_reverse_kl
from distill.opcd.objectives import get_objective


def _direct(student, teacher, mask, k, tau, tail, divergence="reverse"):
    """The objective written out naively in float64: full softmax, the tail as 1 - the top-k's mass."""
    ps = torch.softmax(student.double() / tau, dim=-1)
    pt = torch.softmax(teacher.double().detach() / tau, dim=-1)
    ids = (ps if divergence == "reverse" else pt).detach().topk(k, dim=-1).indices
    a, b = ps.gather(-1, ids), pt.gather(-1, ids)
    if tail == "renormalize":
        a, b = a / a.sum(-1, keepdim=True), b / b.sum(-1, keepdim=True)
    elif tail == "bucket":
        a = torch.cat([a, 1 - a.sum(-1, keepdim=True)], -1)
        b = torch.cat([b, 1 - b.sum(-1, keepdim=True)], -1)
    a, b = a.log(), b.log()
    per = (a.exp() * (a - b)).sum(-1) if divergence == "reverse" else (b.exp() * (b - a)).sum(-1)
    m = mask.double()
    return (per * m).sum() / m.sum()


def _inputs(seed=0, b=3, t=5, v=40):
    g = torch.Generator().manual_seed(seed)
    student = (torch.randn(b, t, v, generator=g, dtype=torch.float64) * 3).requires_grad_()
    teacher = torch.randn(b, t, v, generator=g, dtype=torch.float64) * 3
    mask = torch.ones(b, t)
    mask[0, 3:] = 0
    mask[2, 1:] = 0
    return student, teacher, mask


@pytest.mark.parametrize("tail", ["bucket", "renormalize", "drop"])
@pytest.mark.parametrize("tau", [1.0, 0.7])
def test_reverse_kl_matches_direct_float64_value_and_gradient(tail, tau):
    student, teacher, mask = _inputs()
    ours = topk_reverse_kl(student, teacher, mask, k=7, temperature=tau, tail=tail)
    (grad_ours,) = torch.autograd.grad(ours, student)
    ref = _direct(student, teacher, mask, 7, tau, tail)
    (grad_ref,) = torch.autograd.grad(ref, student)
    torch.testing.assert_close(ours.double(), ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grad_ours, grad_ref, rtol=1e-9, atol=1e-12)
    assert grad_ours[0, 3:].abs().max() == 0  # masked positions get no gradient


def test_float32_logits_agree_with_float64():
    student, teacher, mask = _inputs(seed=1)
    ours = topk_reverse_kl(student.detach().float(), teacher.float(), mask, k=7)
    torch.testing.assert_close(ours.double(), _direct(student, teacher, mask, 7, 1.0, "bucket"), rtol=1e-5, atol=1e-6)


def test_k_equal_to_vocab_is_the_exact_reverse_kl():
    student, teacher, mask = _inputs(seed=2)
    ps, pt = torch.softmax(student.detach() / 0.6, -1), torch.softmax(teacher / 0.6, -1)
    exact = torch.nn.functional.kl_div(pt.log(), ps, reduction="none").sum(-1)  # KL(p_s || p_t)
    exact = (exact * mask).sum() / mask.sum()
    ours = topk_reverse_kl(student, teacher, mask, k=student.shape[-1], temperature=0.6)
    torch.testing.assert_close(ours, exact, rtol=1e-10, atol=1e-12)
    assert ours > 0


def test_teacher_gets_no_gradient_and_identical_models_give_zero():
    student, _, mask = _inputs(seed=3)
    teacher = student.detach().clone().requires_grad_()
    loss = topk_reverse_kl(student, teacher, mask, k=5)
    loss.backward()
    assert teacher.grad is None
    assert abs(loss.item()) < 1e-12


@pytest.mark.parametrize("tail", ["bucket", "renormalize", "drop"])
def test_forward_kl_uses_the_teachers_topk(tail):
    student, teacher, mask = _inputs(seed=4)
    ours = topk_forward_kl(student, teacher, mask, k=6, tail=tail)
    (grad_ours,) = torch.autograd.grad(ours, student)
    ref = _direct(student, teacher, mask, 6, 1.0, tail, divergence="forward")
    (grad_ref,) = torch.autograd.grad(ref, student)
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grad_ours, grad_ref, rtol=1e-9, atol=1e-12)
    # on the student's own top-k the reverse loss differs: the two objectives are not the same number
    assert not torch.isclose(ours, topk_reverse_kl(student, teacher, mask, k=6, tail=tail))


def _drift(tail: str, steps: int = 500) -> tuple[float, float]:
    """A toy student that starts equal to its teacher, trained `steps` Adam steps on the top-8 reverse KL
    over 64 tokens: (the largest loss seen, the full-vocabulary KL(student || teacher) at the end)."""
    g = torch.Generator().manual_seed(0)
    teacher = torch.randn(4, 6, 64, generator=g) * 2
    student = teacher.clone().requires_grad_()
    mask = torch.ones(4, 6)
    optimizer = torch.optim.Adam([student], lr=1e-2)
    worst = 0.0
    for _ in range(steps):
        loss = topk_reverse_kl(student, teacher, mask, k=8, tail=tail)
        worst = max(worst, abs(loss.item()))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        ls, lt = student.log_softmax(-1), teacher.log_softmax(-1)
        full = (ls.exp() * (ls - lt)).sum(-1).mean().item()
    return worst, full


@pytest.mark.parametrize("tail", ["bucket", "renormalize"])
def test_student_equal_to_teacher_is_a_resting_point(tail):
    """With the tail as a bucket (or renormalised over the top-k) the loss is a true divergence: a student equal to
    its teacher has loss 0 and gradient 0, and 500 optimizer steps leave it there (within what Adam makes of
    float32 rounding: measured 2e-5 at worst, against 0.25 and a full KL of 1.2 for the paper's sum)."""
    worst, full = _drift(tail)
    assert worst < 1e-4, worst
    assert full < 1e-4, full


def test_the_papers_topk_sum_alone_drifts_away_from_the_teacher():
    """The reason for the default: summing over the top-k alone is not a divergence (it can go below zero by
    moving mass into the tail), so the same student walks away from its teacher."""
    _, full = _drift("drop")
    assert full > 0.1, full


def test_a_stored_renormalize_flag_still_loads_as_its_tail():
    from distill.opcd import OPCDConfig

    assert OPCDConfig.model_validate({"renormalize": True}).tail == "renormalize"
    assert OPCDConfig.model_validate({"renormalize": False}).tail == "drop"
    assert OPCDConfig().tail == "bucket"
    with pytest.raises(ValueError, match="give `tail` alone"):
        OPCDConfig.model_validate({"renormalize": True, "tail": "bucket"})


@pytest.mark.parametrize("divergence", ["reverse", "forward"])
def test_chunked_loss_equals_unchunked_with_the_same_gradients(divergence):
    torch.manual_seed(0)
    b, t, h, v = 2, 9, 8, 30
    head = torch.nn.Linear(h, v, bias=False).double()
    teacher_head = torch.nn.Linear(h, v, bias=False).double()
    trunk = torch.randn(b, t, h, dtype=torch.float64, requires_grad=True)
    teacher_hidden = torch.randn(b, t, h, dtype=torch.float64)
    mask = torch.ones(b, t)
    mask[1, 4:] = 0
    fn = topk_reverse_kl if divergence == "reverse" else topk_forward_kl

    hidden = trunk * 2.0  # a non-leaf, like a model's output
    full = fn(head(hidden), teacher_head(teacher_hidden), mask, k=5, temperature=0.8)
    full.backward()
    grads_full = trunk.grad.clone(), head.weight.grad.clone()
    trunk.grad, head.weight.grad = None, None

    result = chunked_topk_divergence(
        trunk * 2.0,
        teacher_hidden,
        mask,
        student_head=head,
        teacher_head=teacher_head,
        divergence=divergence,
        k=5,
        temperature=0.8,
        chunk_size=2,
    )
    assert result.tokens == int(mask.sum())
    assert result.loss == pytest.approx(full.item(), rel=1e-10)
    torch.testing.assert_close(trunk.grad, grads_full[0], rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(head.weight.grad, grads_full[1], rtol=1e-9, atol=1e-12)
    assert teacher_head.weight.grad is None


def test_chunked_sampled_kl_and_cross_entropy():
    torch.manual_seed(1)
    b, t, h, v = 2, 6, 4, 12
    head, teacher_head = torch.nn.Linear(h, v).double(), torch.nn.Linear(h, v).double()
    hidden, teacher_hidden = torch.randn(b, t, h, dtype=torch.float64), torch.randn(b, t, h, dtype=torch.float64)
    targets = torch.randint(0, v, (b, t))
    mask = torch.ones(b, t)
    with torch.no_grad():
        ls, lt = torch.log_softmax(head(hidden), -1), torch.log_softmax(teacher_head(teacher_hidden), -1)
    gap = ls.gather(-1, targets[..., None]) - lt.gather(-1, targets[..., None])
    result = chunked_topk_divergence(
        hidden,
        teacher_hidden,
        mask,
        student_head=head,
        teacher_head=teacher_head,
        targets=targets,
        chunk_size=4,
        backward=False,
    )
    assert result.sampled_kl == pytest.approx(gap.mean().item(), rel=1e-10)
    sft = get_objective("sft")
    ce = chunked_token_loss(
        hidden,
        teacher_hidden,
        mask,
        student_head=head,
        teacher_head=None,  # sft does not read the teacher
        loss=functools.partial(sft.token_loss, k=5, temperature=0.5, tail="bucket"),  # at temperature 1 regardless
        targets=targets,
        chunk_size=4,
        backward=False,
    )
    assert ce.loss == pytest.approx(-ls.gather(-1, targets[..., None]).mean().item(), rel=1e-10)
    assert not sft.reads_teacher_logits and ce.sampled_kl == 0.0


def test_the_sampled_kl_reuses_each_chunks_log_normalisers():
    """A chunk's logits go through one logsumexp over the vocabulary per model, for the loss and the
    sampled-token estimate both."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.calls += func is torch.ops.aten.logsumexp.default and args[0].shape[-1] == 12  # the vocabulary
            return func(*args, **(kwargs or {}))

    torch.manual_seed(2)
    head = torch.nn.Linear(4, 12)
    hidden = torch.randn(2, 6, 4)
    targets = torch.randint(0, 12, (2, 6))
    with Count():
        result = chunked_topk_divergence(
            hidden, hidden, torch.ones(2, 6), student_head=head, teacher_head=head, targets=targets,
            k=5, chunk_size=3, backward=False,
        )  # fmt: skip
    assert Count.calls == 4  # 2 chunks x (student, teacher); the sampled KL took 4 more before
    assert result.sampled_kl == pytest.approx(0.0, abs=1e-6)  # the same head and hidden states: no gap
