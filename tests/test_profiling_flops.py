"""Flops profiler numerics: matmul-class flops against torch's FlopCounterMode
(per module and in total) on GPT-like, BERT-like and CNN models defined here,
SDPA against the analytic 4*B*H*Lq*Lk*D, the other operators against their
documented formulas, MoE experts by routed tokens, and the latency tree."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from trainer.profiling import FlopsProfiler

B, L, D, H, V = 2, 16, 32, 4, 64


class SelfAttention(nn.Module):
    def __init__(self, sdpa: bool):
        super().__init__()
        self.sdpa = sdpa
        self.qkv = nn.Linear(D, 3 * D)
        self.proj = nn.Linear(D, D)

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, H, d // H).permute(2, 0, 3, 1, 4)  # 3 x (B, H, L, Dh)
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(d // H)  # (B, H, L, L)
            causal = torch.ones(n, n, dtype=torch.bool).tril()
            y = att.masked_fill(~causal, float("-inf")).softmax(-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, n, d))


class GPTBlock(nn.Module):
    def __init__(self, sdpa: bool):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.attn = SelfAttention(sdpa)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, sdpa: bool, layers: int = 2):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, D), nn.Embedding(L, D)
        self.blocks = nn.ModuleList(GPTBlock(sdpa) for _ in range(layers))
        self.ln_f = nn.LayerNorm(D)
        self.head = nn.Linear(D, V, bias=False)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


class BertSelfAttention(nn.Module):
    """einsum for the values and baddbmm (mask bias + scaled q k^T) for the scores."""

    def __init__(self):
        super().__init__()
        self.query, self.key, self.value = nn.Linear(D, D), nn.Linear(D, D), nn.Linear(D, D)

    def forward(self, x, mask_bias):
        b, n, d = x.shape
        heads = lambda t: t.view(b, n, H, d // H).transpose(1, 2).reshape(b * H, n, d // H)  # noqa: E731
        q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))
        scores = torch.baddbmm(mask_bias.repeat_interleave(H, 0), q, k.transpose(1, 2), alpha=(d // H) ** -0.5)
        y = torch.einsum("bqk,bkd->bqd", scores.softmax(-1), v)  # (B*H, L, Dh)
        return y.view(b, H, n, d // H).transpose(1, 2).reshape(b, n, d)


class FunctionalFeedForward(nn.Module):
    """F.linear on its own weights, not submodules: counted on this module."""

    def __init__(self):
        super().__init__()
        self.w1, self.b1 = nn.Parameter(torch.randn(4 * D, D) * 0.02), nn.Parameter(torch.zeros(4 * D))
        self.w2 = nn.Parameter(torch.randn(D, 4 * D) * 0.02)

    def forward(self, x):
        return F.linear(F.gelu(F.linear(x, self.w1, self.b1)), self.w2)


class BertLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention = BertSelfAttention()
        self.attn_out = nn.Linear(D, D)
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.ffn = FunctionalFeedForward()
        self.dropout = nn.Dropout(0.1)

    def forward(self, x, mask_bias):
        x = self.ln1(x + self.dropout(self.attn_out(self.attention(x, mask_bias))))
        return self.ln2(x + self.dropout(self.ffn(x)))


class Bert(nn.Module):
    def __init__(self, layers: int = 2):
        super().__init__()
        self.word, self.pos, self.segment = nn.Embedding(V, D), nn.Embedding(L, D), nn.Embedding(2, D)
        self.ln = nn.LayerNorm(D)
        self.layers = nn.ModuleList(BertLayer() for _ in range(layers))
        self.pooler = nn.Linear(D, D)
        self.classifier = nn.Linear(D, 3)

    def forward(self, idx, attention_mask):
        x = self.ln(self.word(idx) + self.pos(torch.arange(idx.shape[1])) + self.segment(torch.zeros_like(idx)))
        mask_bias = ((1.0 - attention_mask[:, None, :].float()) * -1e4).expand(-1, idx.shape[1], -1)
        for layer in self.layers:
            x = layer(x, mask_bias)
        return self.classifier(torch.tanh(self.pooler(x[:, 0])))


class MatrixHead(nn.Module):
    """addmm / mm / bmm / a @ b written out by hand."""

    def __init__(self, d_in: int, classes: int):
        super().__init__()
        self.w = nn.Parameter(torch.randn(classes, d_in) * 0.02)
        self.b = nn.Parameter(torch.zeros(classes))
        self.mix = nn.Parameter(torch.eye(classes))

    def forward(self, x):
        y = torch.addmm(self.b, x, self.w.t()).mm(self.mix)
        return torch.bmm(y[:, None, :], self.mix.expand(y.shape[0], -1, -1))[:, 0] @ self.mix


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 8, 3, stride=2, groups=2, bias=False), nn.GroupNorm(2, 8), nn.SiLU(),
            nn.ConvTranspose2d(8, 4, 2, stride=2), nn.AvgPool2d(2),
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = MatrixHead(4, 5)

    def forward(self, x):
        return self.head(self.pool(self.features(x)).flatten(1))


def _bert_inputs():
    idx = torch.randint(0, V, (B, L), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(B, L, dtype=torch.long)
    mask[1, L // 2:] = 0
    return (idx, mask)


MODELS = {
    "gpt_explicit_attention": (lambda: GPT(sdpa=False), lambda: (torch.randint(0, V, (B, L)),)),
    "gpt_sdpa": (lambda: GPT(sdpa=True), lambda: (torch.randint(0, V, (B, L)),)),
    "bert": (Bert, _bert_inputs),
    "cnn": (SmallCNN, lambda: (torch.randn(B, 3, 16, 16),)),
}


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
    return {k[len(root) + 1:] if k != root else "": sum(v.values())
            for k, v in counter.get_flop_counts().items() if k != "Global"}


def _sdpa_flops(batch=B, heads=H, lq=L, lk=L, head_dim=D // H) -> int:
    return 4 * batch * heads * lq * lk * head_dim


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
        sdpa = _sdpa_flops() * attentions if name == "gpt_sdpa" else 0
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
    assert prof.get_total_flops() == _sdpa_flops(batch=3, heads=2, lq=5, lk=7, head_dim=8)
    assert prof.get_total_macs() == _sdpa_flops(batch=3, heads=2, lq=5, lk=7, head_dim=8) // 2
    prof.end_profile()


@pytest.mark.parametrize("layer, shape", [
    (nn.Conv1d(4, 6, 3, padding=1), (2, 4, 10)),
    (nn.Conv2d(4, 6, 3, stride=2, dilation=2, groups=2), (2, 4, 11, 11)),
    (nn.Conv3d(2, 3, 2, bias=False), (1, 2, 4, 4, 4)),
    (nn.ConvTranspose1d(4, 2, 3, stride=2), (2, 4, 5)),
    (nn.ConvTranspose2d(4, 6, 3, groups=2), (1, 4, 5, 5)),
    (nn.ConvTranspose3d(2, 2, 2, stride=2), (1, 2, 3, 3, 3)),
])
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
    assert by_name["blocks.0.ln1"].flops == 5 * tokens * D            # affine layer norm
    assert by_name["blocks.0.mlp.1"].flops == tokens * 4 * D          # GELU: one per element
    assert by_name["blocks.0.mlp.0"].flops == 2 * tokens * D * 4 * D + tokens * 4 * D  # + bias add
    assert by_name["head"].flops == 2 * tokens * D * V                # no bias
    assert by_name["wte"].flops == 0                                  # a lookup
    attn = by_name["blocks.0.attn"]
    own = attn.flops - sum(c.flops for c in attn.children)
    # q @ k^T and att @ v, the scale (div), masked_fill, softmax (per input element)
    scores = B * H * L * L
    assert own == 2 * 2 * scores * (D // H) + scores + scores + scores
    prof.end_profile()

    cnn = SmallCNN().eval()
    prof = _profile(cnn, (torch.randn(B, 3, 16, 16),))
    feats = {p.name: p for p in prof.root.walk()}
    assert feats["features.1"].flops == 2 * B * 8 * 16 * 16            # eval batch norm, affine
    assert feats["features.3"].flops == B * 8 * 16 * 16                # max pool: per input element
    assert feats["features.5"].flops == 5 * B * 8 * 3 * 3              # group norm, affine
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
