"""Small models the flops profiler is checked with, and the analytic count for what
torch's FlopCounterMode cannot count on CPU (scaled_dot_product_attention).

The models cover the ways matmul-class work reaches the dispatcher: nn.Linear,
explicit ``q @ k^T`` attention and F.scaled_dot_product_attention (``GPT``), einsum,
baddbmm and F.linear on a module's own weights (``Bert``), convolutions, norms,
pooling and hand-written addmm/mm/bmm (``SmallCNN``). ``MODELS`` names each with
a function making its inputs; the tests compare against FlopCounterMode per module,
the flops benchmark (and DeepSpeed's get_model_profile, in its own venv) on totals.

This is the only module of the kit that imports torch.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

B, L, D, H, V = 2, 16, 32, 4, 64  # batch, sequence, width, heads, vocabulary


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
        heads = lambda t: t.view(b, n, H, d // H).transpose(1, 2).reshape(b * H, n, d // H)
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
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 8, 3, stride=2, groups=2, bias=False),
            nn.GroupNorm(2, 8),
            nn.SiLU(),
            nn.ConvTranspose2d(8, 4, 2, stride=2),
            nn.AvgPool2d(2),
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = MatrixHead(4, 5)

    def forward(self, x):
        return self.head(self.pool(self.features(x)).flatten(1))


def bert_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and an attention mask with the second sequence's back half padded."""
    idx = torch.randint(0, V, (B, L), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(B, L, dtype=torch.long)
    mask[1, L // 2 :] = 0
    return (idx, mask)


# name -> (make the model, make its forward's arguments); seed torch first for repeatable weights
MODELS = {
    "gpt_explicit_attention": (lambda: GPT(sdpa=False), lambda: (torch.randint(0, V, (B, L)),)),
    "gpt_sdpa": (lambda: GPT(sdpa=True), lambda: (torch.randint(0, V, (B, L)),)),
    "bert": (Bert, bert_inputs),
    "cnn": (SmallCNN, lambda: (torch.randn(B, 3, 16, 16),)),
}


def sdpa_flops(batch: int = B, heads: int = H, lq: int = L, lk: int = L, head_dim: int = D // H) -> int:
    """One scaled_dot_product_attention call: q k^T and the weighted sum of v, 2 * B*H*Lq*Lk*D
    each (FlopCounterMode's CUDA formula)."""
    return 4 * batch * heads * lq * lk * head_dim
