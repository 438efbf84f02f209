"""Tensor parallelism inside pipeline stages (trainer.pipe with tp_size 2) against one-process torch.

The model mixes every kind of tensor-parallel layer with replicated ones: a tied weight used by both stages
(first layer, and transposed before the head), column- and row-parallel linears, a ParallelTransformerBlock
(layer norms, heads split over the tensor-parallel pair, ParallelMLP) and a dense head; stage 0 ends on a
column-parallel layer, so each tensor-parallel rank sends its own shard of the activation down its
pipeline. The reference is the same model in one process with plain nn.Linear layers (and
tests.unit.trainer.test_tp_gpt's DenseBlock); the pipeline starts from its weights, each shard a slice of
them (trainer.tensor_parallel.load_dense_state), and both train with AdamW, gradient clipping at CLIP (the
reference's norm is above it at every step, so the clip acts on every update and the norm must count each
shard on its rank and each replicated parameter, the tied weight included, once) and GAS micro-batches.

Tolerance TOL = 1e-5 absolute on every rank's loss and gradient norm at each of 20 steps and on every final
parameter shard: the pipeline sums the same gradients in another order (tensor-parallel partial sums, then
micro-batches, then replicas). Measured: at most 4.8e-7 on losses (one float32 ulp at ~7), 1.3e-6 on norms
(~3), 1.0e-6 on parameters, both layouts. One slice is left out of the parameter comparison: the attention
keys' bias, whose true gradient is zero (``_comparable``). The 8-rank run also saves a checkpoint halfway
and goes on in a fresh engine, with other weights until it loads it, within the same tolerance. A config
whose tensor_parallel.tp_size differs from the module's is refused, naming both.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests._engine_util import spawn
from tests.unit.trainer.test_tp_gpt import HEADS, DenseBlock
from tests.unit.trainer.test_tp_gpt import HIDDEN as H

STAGES, TP, MICRO, SEQ, STEPS, LR, CLIP, TOL = 2, 2, 2, 4, 20, 1e-3, 0.05, 1e-5


def _transposed(module, x):
    return x @ module.weight


def layer_specs(groups=None) -> list:
    """The model as LayerSpecs: tensor-parallel layers taking ``groups``, or (None) their dense equivalents."""
    from trainer.pipe import LayerSpec, TiedLayerSpec
    from trainer.tensor_parallel import ColumnParallelLinear, ParallelTransformerBlock, RowParallelLinear

    def tp(parallel, fan_in: int, fan_out: int):
        return LayerSpec(parallel, fan_in, fan_out, groups=groups) if groups else LayerSpec(nn.Linear, fan_in, fan_out)

    block = LayerSpec(ParallelTransformerBlock, H, HEADS, 4 * H, groups=groups) if groups else LayerSpec(DenseBlock)
    return [  # uniform partition: layers 0-4 on stage 0, 5-9 on stage 1
        TiedLayerSpec("embed", nn.Linear, H, H, bias=False),
        tp(ColumnParallelLinear, H, 4 * H),
        LayerSpec(nn.Tanh),
        tp(RowParallelLinear, 4 * H, H),
        tp(ColumnParallelLinear, H, 2 * H),
        LayerSpec(nn.Tanh),
        tp(RowParallelLinear, 2 * H, H),
        block,
        TiedLayerSpec("embed", nn.Linear, H, H, bias=False, forward_fn=_transposed),
        LayerSpec(nn.Linear, H, 1),
    ]


class Reference(nn.Module):
    """The dense model in one process; ``pipeline_state`` names its weights as a PipelineModule does."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.funcs, self.names = [], {}
        self.layers = nn.ModuleDict()
        for i, spec in enumerate(layer_specs()):
            key = getattr(spec, "key", None)
            name = f"tied_modules.{key}" if key is not None else str(i)
            if name not in self.names:
                self.names[name] = spec.build()
                self.layers[name.replace(".", "_")] = self.names[name]
            self.funcs.append((self.names[name], getattr(spec, "forward_fn", None)))

    def forward(self, x):
        for module, fn in self.funcs:
            x = module(x) if fn is None else fn(module, x)
        return x

    def pipeline_state(self) -> dict[str, torch.Tensor]:
        return {f"{name}.{k}": v for name, m in self.names.items() for k, v in m.state_dict().items()}


def global_batch(step: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(size, SEQ, H, generator=torch.Generator().manual_seed(100 + step))
    teacher = torch.randn(H, 1, generator=torch.Generator().manual_seed(7))
    return x, 3.0 * torch.tanh(x @ teacher)


def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(out, y)


def reference(dp: int, gas: int) -> dict:
    """Losses and unclipped gradient norms per step, and the final weights, on each step's global batch."""
    model = Reference()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    losses, norms = [], []
    for step in range(STEPS):
        x, y = global_batch(step, dp * gas * MICRO)
        loss = loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()
        norms.append(float(nn.utils.clip_grad_norm_(model.parameters(), CLIP)))
        opt.step()
        losses.append(loss.item())
    return {"losses": losses, "norms": norms, "state": model.pipeline_state()}


# ---------------------------------------------------------------- the pipeline side (in each rank)


def _engine(gas: int, zero: int, *, dense_start: bool = True, tp_in_config: int = TP):
    """The pipeline engine; ``dense_start``: each shard a slice of the reference's weights (else its own)."""
    import trainer
    from trainer.pipe import PipelineModule, stage_groups
    from trainer.tensor_parallel import load_dense_state

    groups = stage_groups(num_stages=STAGES, tp_size=TP)
    net = PipelineModule(
        layers=layer_specs(groups), num_stages=STAGES, tp_size=TP, loss_fn=loss_fn, partition_method="uniform"
    )
    if dense_start:
        load_dense_state(net, Reference().pipeline_state())
    config = {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": gas,
        "gradient_clipping": CLIP,
        "optimizer": {"type": "AdamW", "params": {"lr": LR}},
        "zero_optimization": {"stage": zero},
        "tensor_parallel": {"tp_size": tp_in_config},
        "steps_per_print": 10**9,
        "telemetry": {"enabled": False},
    }
    return trainer.initialize(model=net, config=config)[0]


def _worker(rank: int, world: int, gas: int, zero: int, resume_at: int | None, ckpt: str) -> dict:
    from trainer.config import ConfigError

    with pytest.raises(
        ConfigError, match=r"^tensor_parallel\.tp_size: must equal the PipelineModule's tp_size 2 \(got 1\)$"
    ):
        _engine(gas, zero, tp_in_config=1)
    engine = _engine(gas, zero)
    losses, norms = [], []
    for step in range(STEPS):
        if step == resume_at:  # a fresh engine with other weights: all must come from the checkpoint
            engine.save_checkpoint(ckpt)
            engine = _engine(gas, zero, dense_start=False)
            engine.load_checkpoint(ckpt)
        top, dp = engine.topology, engine.dp_world_size
        x, y = global_batch(step, dp * gas * MICRO)
        x, y = x.view(dp, gas, MICRO, SEQ, H)[top.data_rank], y.view(dp, gas, MICRO, SEQ, 1)[top.data_rank]
        losses.append(float(engine.train_batch(iter([(x[k], y[k]) for k in range(gas)]))))
        norms.append(engine.get_global_grad_norm())
    params = {
        n: (p.detach().clone(), getattr(p, "partition_dim", None), getattr(p, "partition_stride", 1))
        for n, p in engine.module.named_parameters()
    }
    return {
        "place": (top.stage, top.data_rank, top.tp_rank),
        "engine": (engine.dp_rank, engine.tp_rank, dp),
        "losses": losses,
        "norms": norms,
        "params": params,
    }


def _comparable(name: str, weight: torch.Tensor) -> torch.Tensor:
    """``weight`` without the attention keys' bias (a q, k, v shard holds its rows of each): its true
    gradient is zero (softmax ignores q . b_k, the same shift of every key's score), so it gets float
    noise (~1e-9), which AdamW's normalised update turns into steps of up to lr either side."""
    if name.endswith("attn.qkv.bias"):
        q, _, v = weight.chunk(3)
        return torch.cat([q, v])
    return weight


def _check(results: list[dict], world: int, gas: int) -> None:
    from trainer.tensor_parallel import shard

    dp = world // (STAGES * TP)
    want = reference(dp, gas)
    assert min(want["norms"]) > CLIP, want["norms"]  # the clip acts at every step
    seen, worst = set(), {"loss": 0.0, "norm": 0.0, "param": 0.0}
    for rank, r in enumerate(results):
        stage, d, t = r["place"]
        assert rank == stage * dp * TP + d * TP + t and r["engine"] == (d, t, dp)
        for kind, key in (("loss", "losses"), ("norm", "norms")):
            for step, (g, w) in enumerate(zip(r[key], want[key], strict=True)):
                assert g == pytest.approx(w, abs=TOL, rel=0), (rank, kind, step, r[key], want[key])
                worst[kind] = max(worst[kind], abs(g - w))
        for name, (value, dim, stride) in r["params"].items():
            full = want["state"][name]
            expected = _comparable(name, full if dim is None else shard(full, dim, stride, TP, t))
            value = _comparable(name, value)
            torch.testing.assert_close(
                value, expected, atol=TOL, rtol=0, msg=lambda m, at=f"rank {rank} {name}": f"{at}: {m}"
            )
            worst["param"] = max(worst["param"], float((value - expected).abs().max()))
            seen.add(name)
    assert seen == set(want["state"]), "every weight lives on some stage"
    print(f"PP{STAGES} x TP{TP} x DP{dp}, gas {gas}: largest differences {worst}")


def test_pp2_tp2_equals_torch_with_clipping_and_a_tied_weight(tmp_path):
    results = spawn(_worker, 4, tmp_path / "out", 4, 0, None, str(tmp_path / "ckpt"))
    _check(results, 4, 4)


@pytest.mark.slow
def test_pp2_tp2_dp2_zero1_equals_torch_with_clipping_a_tied_weight_and_a_resume(tmp_path):
    results = spawn(_worker, 8, tmp_path / "out", 2, 1, STEPS // 2, str(tmp_path / "ckpt"))
    _check(results, 8, 2)
