"""Flops profiler numerics: matmul-class flops against torch's FlopCounterMode
(per module and in total) on the GPT-like, BERT-like and CNN models of
collector.testing.flops_models, SDPA against the analytic 4*B*H*Lq*Lk*D, the other
operators against their documented formulas, MoE experts by routed tokens, and the
latency tree."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from collector.testing.flops_models import GPT, MODELS, B, D, H, L, SmallCNN, V, sdpa_flops
from trainer.profiling import FlopsProfiler


def _profile(model, inputs, backward=False) -> FlopsProfiler:
    prof = FlopsProfiler(model)
    prof.start_profile()
    out = model(*inputs)
    if backward:
        out.float().pow(2).mean().backward()
    prof.stop_profile()
    return prof


def _reference(model, inputs) -> dict[str, int]:
    """FlopCounterMode's per-module flops, keyed by our dotted names ('' = root)."""
    with FlopCounterMode(display=False) as counter:
        model(*inputs)
    root = type(model).__name__
    return {
        k[len(root) + 1 :] if k != root else "": sum(v.values())
        for k, v in counter.get_flop_counts().items()
        if k != "Global"
    }


@pytest.mark.parametrize("name", list(MODELS))
def test_matmul_class_flops_match_flop_counter_per_module(name):
    make, inputs = MODELS[name]
    torch.manual_seed(0)
    model, args = make(), inputs()
    prof = _profile(model, args)
    reference = _reference(model, args)
    called = [p for p in prof.root.walk() if p.calls]
    assert called, "the forward ran through profiled modules"
    for p in called:
        # FlopCounterMode counts SDPA as 0 on CPU: the analytic count comes on top,
        # once per attention module in this subtree
        attentions = sum(1 for c in p.walk() if c.module_type == "SelfAttention")
        sdpa = sdpa_flops() * attentions if name == "gpt_sdpa" else 0
        assert 2 * p.macs == reference.get(p.name, 0) + sdpa, p.name
    assert prof.get_total_macs() > 0
    prof.end_profile()


def test_sdpa_counts_4_b_h_lq_lk_d():
    q = torch.randn(3, 2, 5, 8)
    k, v = torch.randn(3, 2, 7, 8), torch.randn(3, 2, 7, 8)

    class Attend(nn.Module):
        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v)

    prof = _profile(Attend(), (q, k, v))
    assert prof.get_total_flops() == sdpa_flops(batch=3, heads=2, lq=5, lk=7, head_dim=8)
    assert prof.get_total_macs() == sdpa_flops(batch=3, heads=2, lq=5, lk=7, head_dim=8) // 2
    prof.end_profile()


@pytest.mark.parametrize(
    "layer, shape",
    [
        (nn.Conv1d(4, 6, 3, padding=1), (2, 4, 10)),
        (nn.Conv2d(4, 6, 3, stride=2, dilation=2, groups=2), (2, 4, 11, 11)),
        (nn.Conv3d(2, 3, 2, bias=False), (1, 2, 4, 4, 4)),
        (nn.ConvTranspose1d(4, 2, 3, stride=2), (2, 4, 5)),
        (nn.ConvTranspose2d(4, 6, 3, groups=2), (1, 4, 5, 5)),
        (nn.ConvTranspose3d(2, 2, 2, stride=2), (1, 2, 3, 3, 3)),
    ],
)
def test_convolutions_match_flop_counter_plus_bias(layer, shape):
    x = torch.randn(shape)
    prof = _profile(layer, (x,))
    reference = _reference(layer, (x,))[""]
    assert 2 * prof.get_total_macs() == reference
    bias_adds = layer(x).numel() if layer.bias is not None else 0
    assert prof.get_total_flops() == reference + bias_adds
    prof.end_profile()


def test_other_operators_follow_the_documented_formulas():
    model = GPT(sdpa=False, layers=1)
    idx = torch.randint(0, V, (B, L))
    prof = _profile(model, (idx,))
    by_name = {p.name: p for p in prof.root.walk()}
    tokens = B * L
    assert by_name["blocks.0.ln1"].flops == 5 * tokens * D  # affine layer norm
    assert by_name["blocks.0.mlp.1"].flops == tokens * 4 * D  # GELU: one per element
    assert by_name["blocks.0.mlp.0"].flops == 2 * tokens * D * 4 * D + tokens * 4 * D  # + bias add
    assert by_name["head"].flops == 2 * tokens * D * V  # no bias
    assert by_name["wte"].flops == 0  # a lookup
    attn = by_name["blocks.0.attn"]
    own = attn.flops - sum(c.flops for c in attn.children)
    # q @ k^T and att @ v, the scale (div), masked_fill, softmax (per input element)
    scores = B * H * L * L
    assert own == 2 * 2 * scores * (D // H) + scores + scores + scores
    prof.end_profile()

    cnn = SmallCNN().eval()
    prof = _profile(cnn, (torch.randn(B, 3, 16, 16),))
    feats = {p.name: p for p in prof.root.walk()}
    assert feats["features.1"].flops == 2 * B * 8 * 16 * 16  # eval batch norm, affine
    assert feats["features.3"].flops == B * 8 * 16 * 16  # max pool: per input element
    assert feats["features.5"].flops == 5 * B * 8 * 3 * 3  # group norm, affine
    prof.end_profile()


def test_parent_is_at_least_the_sum_of_its_children():
    for make, inputs in MODELS.values():
        model = make()
        prof = _profile(model, inputs())
        for p in prof.root.walk():
            assert p.flops >= sum(c.flops for c in p.children), p.name
            assert p.macs >= sum(c.macs for c in p.children), p.name
            assert p.params >= sum(c.params for c in p.children), p.name
        assert prof.get_total_params() == sum(q.numel() for q in model.parameters())
        prof.end_profile()


class TopOneMoE(nn.Module):
    def __init__(self, experts: int = 4):
        super().__init__()
        self.gate = nn.Linear(D, experts, bias=False)
        self.experts = nn.ModuleList(nn.Linear(D, D, bias=False) for _ in range(experts))

    def forward(self, x):
        choice = self.gate(x).argmax(-1)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            routed = choice == e
            if routed.any():
                out[routed] = expert(x[routed])
        return out


def test_moe_experts_are_counted_by_routed_tokens():
    torch.manual_seed(3)
    moe, x = TopOneMoE(), torch.randn(40, D)
    tokens = torch.bincount(moe.gate(x).argmax(-1), minlength=4)
    assert (tokens > 0).sum() >= 2, "the test needs more than one expert in use"
    prof = _profile(moe, (x,))
    experts = {p.name: p for p in prof.root.walk() if p.name.startswith("experts.")}
    for e, n in enumerate(tokens.tolist()):
        assert experts[f"experts.{e}"].macs == n * D * D
        assert experts[f"experts.{e}"].calls == (1 if n else 0)
    prof.end_profile()


def test_forward_and_backward_latency_per_module():
    model = GPT(sdpa=True)
    prof = _profile(model, (torch.randint(0, V, (B, L)),), backward=True)
    for p in prof.root.walk():
        if not p.calls:  # a ModuleList is never called itself
            assert p.module_type == "ModuleList" and p.bwd_ns is None
            continue
        assert p.fwd_ns > 0, p.name
        assert p.bwd_ns is not None and p.bwd_ns > 0, p.name
        for child in p.children:
            if child.calls:  # a child's backward runs inside its parent's
                assert child.fwd_ns <= p.fwd_ns and child.bwd_ns <= p.bwd_ns, child.name
    prof.end_profile()
