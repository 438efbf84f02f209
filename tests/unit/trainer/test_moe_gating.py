"""Single-process MoE: gating and capacity arithmetic, the layer against a
token-by-token reference (outputs and gradients), PR-MoE, the pyramid helper
and the settings that must be refused."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests._moe_reference import reference_capacity, reference_moe
from trainer.moe import MoE, TopKGate, expert_capacity, is_expert_param, pyramid_moe
from trainer.moe.groups import validate

M = 8


def expert() -> nn.Module:
    return nn.Sequential(nn.Linear(M, 12), nn.GELU(), nn.Linear(12, M))


@pytest.mark.parametrize(
    "S,E,k,cf,min_cap,expected",
    [
        (16, 4, 1, 1.0, 4, 4),
        (16, 4, 1, 1.25, 4, 5),
        (16, 4, 2, 1.0, 4, 8),
        (16, 4, 1, 1.0, 6, 6),
        (10, 4, 1, 1.0, 0, 3),
        (10, 3, 2, 0.5, 1, 4),
        (7, 8, 1, 1.0, 1, 1),
    ],
)
def test_capacity_is_ceil_k_tokens_over_experts_times_factor_clamped_by_min(S, E, k, cf, min_cap, expected):
    assert expert_capacity(S, E, k, cf, min_cap) == expected == reference_capacity(S, E, k, cf, min_cap)


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("capacity_factor", [0.5, 1.0, 2.0])
def test_routing_matches_the_token_by_token_reference(k, capacity_factor):
    torch.manual_seed(1)
    S, E = 24, 4
    gate = TopKGate(M, E, k, capacity_factor, min_capacity=1, use_rts=False, top2_2nd_expert_sampling=False)
    tokens = torch.randn(S, M)
    r = gate(tokens)
    C = reference_capacity(S, E, k, capacity_factor, 1)
    assert r.capacity == C
    identity = [lambda t: t] * E  # output = sum of kept weights * token: checks the combine weights
    ref_out, ref_aux, routed, dropped = reference_moe(tokens, gate.weight, identity, k=k, capacity=C)
    assert torch.equal(r.expert_counts, routed) and int(routed.sum()) == k * S
    assert torch.equal(r.dropped, dropped)
    assert torch.equal(r.dropped, (routed - C).clamp_min(0))
    if capacity_factor == 0.5:
        assert int(dropped.sum()) > 0  # the case really drops tokens
    out = torch.einsum("sec,sm->sm", r.combine_weights(), tokens)
    torch.testing.assert_close(out, ref_out, rtol=0, atol=1e-6)
    torch.testing.assert_close(r.aux_loss, ref_aux.float(), rtol=0, atol=1e-6)
    # each slot of each expert holds at most one token, and only kept tokens hold one
    assert int(r.dispatch_mask().sum(0).max()) <= 1
    assert int(r.dispatch_mask().sum()) == k * S - int(dropped.sum())


def test_random_token_selection_keeps_capacity_tokens_per_overflowing_expert():
    torch.manual_seed(2)
    S, E = 32, 4
    gate = TopKGate(M, E, 1, 0.5, min_capacity=1, use_rts=True).train()
    r = gate(torch.randn(S, M))
    kept = r.dispatch_mask().sum(dim=(0, 2))
    assert torch.equal(kept, r.expert_counts.clamp_max(r.capacity))
    assert torch.equal(r.dropped, (r.expert_counts - r.capacity).clamp_min(0))


def test_no_drop_mode_sizes_capacity_to_the_busiest_expert():
    torch.manual_seed(3)
    gate = TopKGate(M, 4, 2, 0.25, min_capacity=1, drop_tokens=False, top2_2nd_expert_sampling=False)
    r = gate(torch.randn(20, M))
    assert r.capacity == int(r.expert_counts.max())
    assert int(r.dropped.sum()) == 0 and int(r.dispatch_mask().sum()) == 40


@pytest.mark.parametrize("drop_tokens", [True, False])
@pytest.mark.parametrize("k", [1, 2])
def test_layer_output_and_gradients_match_the_reference(k, drop_tokens):
    torch.manual_seed(4)
    moe = MoE(
        M,
        expert(),
        num_experts=4,
        k=k,
        capacity_factor=1.0,
        min_capacity=1,
        use_rts=False,
        top2_2nd_expert_sampling=False,
        drop_tokens=drop_tokens,
    ).double()
    x = torch.randn(3, 6, M, dtype=torch.float64, requires_grad=True)
    out, aux, counts = moe(x)
    (out.square().sum() + aux).backward()

    experts = [e for e in moe.experts.local_experts]
    assert not torch.equal(experts[0][0].weight, experts[1][0].weight), "experts start distinct"
    xr = x.detach().clone().requires_grad_(True)
    C = reference_capacity(18, 4, k, 1.0, 1) if drop_tokens else int(counts.max())  # no-drop: the busiest expert
    ref, ref_aux, routed, dropped = reference_moe(xr.reshape(-1, M), moe.gate.weight, experts, k=k, capacity=C)
    assert (int(dropped.sum()) > 0) == drop_tokens
    assert torch.equal(counts, routed)
    torch.testing.assert_close(out.reshape(-1, M), ref, rtol=0, atol=1e-10)
    grads = [p.grad.clone() for p in moe.parameters()]
    moe.zero_grad()
    (ref.square().sum() + ref_aux).backward()
    torch.testing.assert_close(x.grad, xr.grad, rtol=0, atol=1e-10)
    for got, p in zip(grads, moe.parameters()):
        torch.testing.assert_close(got, p.grad, rtol=0, atol=1e-10)


def test_residual_moe_mixes_moe_and_dense_mlp_by_learned_coefficient():
    torch.manual_seed(5)
    moe = MoE(M, expert(), num_experts=2, use_residual=True, min_capacity=1, use_rts=False)
    x = torch.randn(10, M)
    out, _, _ = moe(x)
    plain, _, _ = moe._moe(x)
    coef = torch.softmax(moe.coefficient(x), dim=-1)
    torch.testing.assert_close(out, plain * coef[:, :1] + moe.mlp(x) * coef[:, 1:])
    assert not is_expert_param(moe.mlp[0].weight) and not is_expert_param(moe.coefficient.weight)
    assert all(is_expert_param(p) and p.group_name == "ep_size_1" for p in moe.experts.parameters())


def test_pyramid_gives_each_layer_its_expert_count_and_id():
    layers = pyramid_moe(M, expert(), [2, 2, 4], first_layer_id=1, min_capacity=1)
    assert [m.num_experts for m in layers] == [2, 2, 4]
    assert [m.layer_id for m in layers] == [1, 2, 3]
    assert [len(m.experts.local_experts) for m in layers] == [2, 2, 4]
    with pytest.raises(ValueError, match=r"^MoE layer 1: moe\.ep_size: must not exceed the world size 1 \(got 2\)$"):
        pyramid_moe(M, expert(), [2, 4], ep_size=[1, 2])


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (
            dict(num_experts=3, ep_size=2, world=4),
            r"^moe\.num_experts: must be divisible by moe\.ep_size \(2\) \(got 3\)$",
        ),
        (dict(num_experts=8, ep_size=8, world=4), r"^moe\.ep_size: must not exceed the world size 4 \(got 8\)$"),
        (dict(num_experts=6, ep_size=3, world=4), r"^moe\.ep_size: must divide the world size 4 \(got 3\)$"),
        (dict(num_experts=0, ep_size=1, world=4), r"^moe\.num_experts: must be >= 1 \(got 0\)$"),
        (dict(num_experts=2.5, ep_size=1, world=4), r"^moe\.num_experts: must be an integer \(got 2\.5\)$"),
        (
            dict(num_experts=4, ep_size=4, world=4, tp=2),
            r"^moe\.ep_size: must not exceed the data-parallel size 2 "
            r"\(world 4 / tensor_parallel\.tp_size 2\) \(got 4\)$",
        ),
        (
            dict(num_experts=4, ep_size=1, world=4, tp=3),
            r"^tensor_parallel\.tp_size: must divide the world size 4 \(got 3\)$",
        ),
    ],
)
def test_bad_expert_parallel_settings_name_the_key(kwargs, message):
    with pytest.raises(ValueError, match=message):
        validate(kwargs["num_experts"], kwargs["ep_size"], kwargs["world"], kwargs.get("tp", 1))


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(k=3), r"^moe\.k: must be one of 1, 2 \(got 3\)$"),
        (dict(capacity_factor=0), r"^moe\.capacity_factor: must be > 0 \(got 0\)$"),
        (dict(capacity_factor="big"), r"^moe\.capacity_factor: must be a finite number \(got 'big'\)$"),
        (dict(eval_capacity_factor=-1.0), r"^moe\.eval_capacity_factor: must be > 0 \(got -1\.0\)$"),
        (dict(min_capacity=-1), r"^moe\.min_capacity: must be >= 0 \(got -1\)$"),
        (dict(noisy_gate_policy="Gaussian"), r"^moe\.noisy_gate_policy: must be one of None, 'Jitter', 'RSample'"),
        (dict(ep_size=2), r"^moe\.ep_size: must not exceed the world size 1 \(got 2\)$"),
    ],
)
def test_bad_layer_settings_name_the_key(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MoE(M, expert(), num_experts=4, **kwargs)


def test_eval_uses_eval_capacity_factor_and_no_noise():
    torch.manual_seed(6)
    gate = TopKGate(M, 4, 1, capacity_factor=0.5, eval_capacity_factor=2.0, min_capacity=1, noisy_gate_policy="RSample")
    x = torch.randn(16, M)
    assert gate.train()(x).capacity == 2
    gate.eval()
    a, b = gate(x), gate(x)
    assert a.capacity == 8
    assert torch.equal(a.combine_weights(), b.combine_weights())  # no Gumbel noise outside training
    probs = torch.softmax(x @ gate.weight.t(), dim=1)
    assert torch.equal(a.dispatch_mask().any(dim=2).float().argmax(dim=1), probs.argmax(dim=1))


@pytest.mark.parametrize("k", [1, 2])
def test_dispatch_and_combine_have_exact_gradients_including_dropped_choices(k):
    from trainer.moe.dispatch import combine, dispatch

    torch.manual_seed(7)
    S, E, C = 6, 2, 3
    slots = torch.tensor([0, 4, 6, 1, 6, 5] + ([2, 6, 3, 6, 6, 6] if k == 2 else []))  # 6 = dropped
    tokens = torch.randn(S, M, dtype=torch.float64, requires_grad=True)
    weights = torch.rand(k, S, dtype=torch.float64).masked_fill(slots.view(k, S) == E * C, 0).requires_grad_()
    buffer = dispatch(tokens, slots, E * C)
    kept = slots < E * C
    assert torch.equal(buffer[slots[kept]], tokens.repeat(k, 1)[kept])
    assert int((buffer.abs().sum(1) != 0).sum()) == int(kept.sum())  # every other row stays zero
    torch.autograd.gradcheck(lambda t: dispatch(t, slots, E * C), (tokens,))
    outputs = torch.randn(E * C, M, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(lambda o, w: combine(o, slots, w), (outputs, weights))
    expected = sum(weights[i, :, None] * torch.cat([outputs, torch.zeros(1, M)])[slots.view(k, S)[i]] for i in range(k))
    torch.testing.assert_close(combine(outputs, slots, weights), expected, rtol=0, atol=1e-12)
