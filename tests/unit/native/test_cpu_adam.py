"""native.CPUAdam against torch.optim.Adam / AdamW.

Reference: torch.optim.Adam/AdamW (foreach=False, the CPU default); with
bias_correction=False, which torch lacks, torch's update written out op by op.
Tolerance after 100 steps at lr=1e-2: relative L2 error <= 1e-6 over the
whole tensor, and every element within rtol=1e-6 plus atol=1e-5. Parameters are
O(1); the absolute floor covers the odd element (about 1 in 1e6) whose update
lr*m/(sqrt(v)+eps) is ill-conditioned (m a cancelling sum, sqrt(v) near eps),
where any two correct fp32 implementations differ by a few ulps of lr. The
kernel follows torch's op order (fma'd lerp, no other contraction); typical
max difference is ~2e-7, the worst seen 2.2e-6.

Runs on whichever backend native.cpu_adam.BACKEND reports; tests/integration/native/test_fallback.py
re-runs this file with RANKSCOPE_NATIVE=off to cover the pure-torch path.
"""

import pytest
import torch

from native import CPUAdam, cpu_adam

RTOL, ATOL = 1e-6, 1e-5
STEPS = 100


def _gradients(size, gen):
    """STEPS pseudo-random gradients, cheap for 1M elements: a pool of 5 normal
    draws, each use rescaled, so moments keep changing without 100 randn calls."""
    pool = [torch.randn(size, generator=gen) for _ in range(5)]
    for step in range(STEPS):
        yield pool[step % 5] * (0.5 + (step * 37 % 11) / 10)


def _adam_reference_step(p, grad, m, v, step, lr, betas, eps, weight_decay, adamw_mode, bias_correction):
    """torch.optim.Adam(W)'s single-tensor update written out op by op, with
    torch's bias corrections made switchable (torch itself has no such flag)."""
    beta1, beta2 = betas
    if adamw_mode:
        p.mul_(1 - lr * weight_decay)
    elif weight_decay != 0:
        grad = grad.add(p, alpha=weight_decay)
    m.lerp_(grad, 1 - beta1)
    v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    bc1 = 1 - beta1**step if bias_correction else 1.0
    bc2 = 1 - beta2**step if bias_correction else 1.0
    denom = (v.sqrt() / bc2**0.5).add_(eps)
    p.addcdiv_(m, denom, value=-lr / bc1)


def _run_pair(size, adamw_mode, weight_decay, bias_correction, seed=0):
    gen = torch.Generator().manual_seed(seed)
    start = torch.randn(size, generator=gen)
    ours = start.clone()
    theirs = start.clone().requires_grad_(True)
    hyper = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=weight_decay)
    optimizer = CPUAdam([ours], adamw_mode=adamw_mode, bias_correction=bias_correction, **hyper)
    reference = (torch.optim.AdamW if adamw_mode else torch.optim.Adam)([theirs], foreach=False, **hyper)
    m, v = torch.zeros(size), torch.zeros(size)
    for step, grad in enumerate(_gradients(size, gen), start=1):
        ours.grad = grad
        optimizer.step()
        if bias_correction:
            theirs.grad = grad.clone()
            reference.step()
        else:
            with torch.no_grad():
                _adam_reference_step(theirs, grad, m, v, step, adamw_mode=adamw_mode, bias_correction=False, **hyper)
    return ours, theirs.detach()


@pytest.mark.parametrize("size", [1, 7, 1_000_003])
@pytest.mark.parametrize("adamw_mode", [True, False])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
@pytest.mark.parametrize("bias_correction", [True, False])
def test_matches_torch_over_100_steps(size, adamw_mode, weight_decay, bias_correction):
    ours, theirs = _run_pair(size, adamw_mode, weight_decay, bias_correction)
    assert torch.linalg.vector_norm(ours - theirs) <= 1e-6 * torch.linalg.vector_norm(theirs)
    torch.testing.assert_close(ours, theirs, rtol=RTOL, atol=ATOL)
    assert not torch.equal(ours, torch.randn(size, generator=torch.Generator().manual_seed(0)))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("size", [7, 1_000_003])
def test_copy_out_equals_fp32_result_cast(dtype, size):
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(size, generator=gen)
    b = torch.randn(3, 5, generator=gen) * 1e3  # large values exercise fp16 rounding
    optimizer = CPUAdam([a, b], lr=1e-3, weight_decay=0.01)
    copies = [torch.empty(size, dtype=dtype), torch.empty(15, dtype=dtype)]
    for _ in range(3):
        a.grad = torch.randn(size, generator=gen)
        b.grad = torch.randn(3, 5, generator=gen)
        optimizer.step(copy_to=copies)
        assert torch.equal(copies[0], a.to(dtype))
        assert torch.equal(copies[1], b.reshape(-1).to(dtype))


def test_copy_out_skips_none_entries_and_params_without_grad():
    a, b = torch.ones(4), torch.ones(4)
    optimizer = CPUAdam([a, b], lr=0.1)
    a.grad = torch.ones(4)
    copy_b = torch.full((4,), 7.0, dtype=torch.bfloat16)
    optimizer.step(copy_to=[None, copy_b])
    assert torch.all(a < 1) and torch.equal(b, torch.ones(4))
    assert torch.equal(copy_b, torch.full((4,), 7.0, dtype=torch.bfloat16))  # b had no grad


def test_param_groups_with_their_own_hyperparameters():
    gen = torch.Generator().manual_seed(2)
    start = [torch.randn(100, generator=gen), torch.randn(50, generator=gen)]
    ours = [t.clone() for t in start]
    theirs = [t.clone().requires_grad_(True) for t in start]
    optimizer = CPUAdam(
        [{"params": [ours[0]], "lr": 1e-2, "weight_decay": 0.5}, {"params": [ours[1]], "betas": (0.8, 0.99)}], lr=1e-3
    )
    reference = torch.optim.AdamW(
        [{"params": [theirs[0]], "lr": 1e-2, "weight_decay": 0.5}, {"params": [theirs[1]], "betas": (0.8, 0.99)}],
        lr=1e-3,
        weight_decay=0.0,
    )
    for _ in range(20):
        for o, t in zip(ours, theirs):
            o.grad = torch.randn(o.shape, generator=gen)
            t.grad = o.grad.clone()
        optimizer.step()
        reference.step()
    for o, t in zip(ours, theirs):
        torch.testing.assert_close(o, t.detach(), rtol=RTOL, atol=ATOL)


def test_state_dict_round_trip_continues_identically():
    gen = torch.Generator().manual_seed(3)
    p = torch.randn(1000, generator=gen)
    grads = [torch.randn(1000, generator=gen) for _ in range(10)]
    straight = p.clone()
    optimizer = CPUAdam([straight], lr=1e-2)
    for g in grads:
        straight.grad = g
        optimizer.step()

    resumed = p.clone()
    first = CPUAdam([resumed], lr=1e-2)
    for g in grads[:5]:
        resumed.grad = g
        first.step()
    second = CPUAdam([resumed], lr=1e-2)
    second.load_state_dict(first.state_dict())
    for g in grads[5:]:
        resumed.grad = g
        second.step()
    assert torch.equal(resumed, straight)


def test_closure_loss_is_returned():
    p = torch.ones(3, requires_grad=True)
    optimizer = CPUAdam([p])

    def closure():
        optimizer.zero_grad()
        loss = (p * p).sum()
        loss.backward()
        return loss

    assert optimizer.step(closure).item() == 3.0
    assert torch.all(p.detach() < 1)


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="amsgrad"):
        CPUAdam([torch.zeros(2)], amsgrad=True)
    with pytest.raises(ValueError, match="float32"):
        CPUAdam([torch.zeros(2, dtype=torch.float16)])
    with pytest.raises(ValueError, match="non-contiguous"):
        CPUAdam([torch.zeros(4, 4).t()])
    with pytest.raises(ValueError, match="betas"):
        CPUAdam([torch.zeros(2)], betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="lr"):
        CPUAdam([torch.zeros(2)], lr=-1.0)
    p = torch.zeros(4)
    p.grad = torch.ones(4)
    optimizer = CPUAdam([p])
    with pytest.raises(ValueError, match=r"copy_to\[0\].*4 elements"):
        optimizer.step(copy_to=[torch.zeros(3, dtype=torch.float16)])
    with pytest.raises(ValueError, match=r"copy_to\[0\].*float16/bfloat16"):
        optimizer.step(copy_to=[torch.zeros(4, dtype=torch.float64)])
    with pytest.raises(ValueError, match="1 parameters"):
        optimizer.step(copy_to=[None, None])


def test_backend_is_reported():
    assert cpu_adam.BACKEND in {"native", "torch"}
