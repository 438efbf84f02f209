"""DeepSpeed's ``deepspeed.pipe`` model description: a model as a list of layers cut into stages.

    layers = [LayerSpec(nn.Linear, 64, 64), nn.ReLU(), LayerSpec(nn.Linear, 64, 10)]
    net = PipelineModule(layers=layers, num_stages=2, loss_fn=nn.CrossEntropyLoss())
    engine, _, _, _ = trainer.initialize(model=net, config=ds_config)   # a PipelineEngine
    loss = engine.train_batch(data_iter)                                 # (inputs, labels) micro-batches

Each rank builds only its stage's layers (a ``LayerSpec`` is built where it runs, as in DeepSpeed).
Ranks are laid out as trainer.pipe.topology says: rank = stage * (dp * tp) + data_rank * tp + tp_rank,
so the replicas of one stage are neighbours and each pipeline is one rank per stage. With
``tp_size`` > 1 a stage's tensor-parallel layers take ``stage_groups(num_stages, tp_size)``.
With ``virtual_stages`` v > 1 (Megatron's virtual pipeline stages) the layers are cut into
``num_stages * v`` chunks and stage s builds chunks s, s + num_stages, ... (trainer.pipe.schedule).
"""

from __future__ import annotations

import itertools
import random
import re
from functools import partial

import torch
from torch import nn

from trainer import comm
from trainer.pipe.topology import PipelineError, PipeTopology, pipe_groups

__all__ = ["LayerSpec", "PipeTopology", "PipelineError", "PipelineModule", "TiedLayerSpec"]


class LayerSpec:
    """A layer to build later, on the stage that runs it: ``LayerSpec(nn.Linear, 64, 64, bias=False)``."""

    def __init__(self, typename, *module_args, **module_kwargs):
        if not (isinstance(typename, type) and issubclass(typename, nn.Module)):
            raise RuntimeError("LayerSpec only supports torch.nn.Module types.")
        self.typename = typename
        self.module_args = module_args
        self.module_kwargs = module_kwargs

    def build(self) -> nn.Module:
        return self.typename(*self.module_args, **self.module_kwargs)

    def __repr__(self) -> str:
        args = [repr(a) for a in self.module_args] + [f"{k}={v!r}" for k, v in self.module_kwargs.items()]
        return f"{self.typename.__name__}({', '.join(args)})"


class TiedLayerSpec(LayerSpec):
    """A layer whose weights are shared by every spec with the same ``key`` (an embedding reused as
    the output projection): one module per stage that uses it, its ``tied_weight_attr`` weights
    kept equal across those stages (same start, gradients summed). ``forward_fn(module, x)``
    replaces the module's forward where given."""

    def __init__(self, key, typename, *module_args, forward_fn=None, tied_weight_attr=("weight",), **module_kwargs):
        super().__init__(typename, *module_args, **module_kwargs)
        self.key = key
        self.forward_fn = forward_fn
        self.tied_weight_attr = [tied_weight_attr] if isinstance(tied_weight_attr, str) else list(tied_weight_attr)


def partition_uniform(num_items: int, num_parts: int) -> list[int]:
    """Stage boundaries with layer counts differing by at most one (earlier stages take the extra)."""
    if num_items <= num_parts:
        return [min(p, num_items) for p in range(num_parts + 1)]
    chunk, extra = divmod(num_items, num_parts)
    return [p * chunk + min(p, extra) for p in range(num_parts + 1)]


def partition_balanced(weights: list[int], num_parts: int) -> list[int]:
    """Stage boundaries minimising the spread between the heaviest and lightest stage (DeepSpeed's
    linear-partition dynamic programme, so a model splits at the same layers on both engines)."""
    n = len(weights)
    if n <= num_parts:
        return partition_uniform(n, num_parts)
    inf = float("inf")
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    hi = [[inf] * (num_parts + 1) for _ in range(n + 1)]
    lo = [[inf] * (num_parts + 1) for _ in range(n + 1)]
    cost = [[inf] * (num_parts + 1) for _ in range(n + 1)]
    cut = [[0] * (num_parts + 1) for _ in range(n + 1)]
    hi[0][0] = cost[0][0] = 0
    for i in range(1, n + 1):
        for j in range(1, min(i, num_parts) + 1):
            for k in range(i):
                part = prefix[i] - prefix[k]
                top, bottom = max(hi[k][j - 1], part), min(lo[k][j - 1], part)
                if cost[i][j] >= top - bottom:
                    cost[i][j], hi[i][j], lo[i][j], cut[i][j] = top - bottom, top, bottom, k
    parts = [n]
    for j in range(num_parts, 0, -1):
        parts.append(cut[parts[-1]][j])
    return parts[::-1]


class PipelineModule(nn.Module):
    """DeepSpeed's PipelineModule: ``layers`` (LayerSpec, TiedLayerSpec, modules or callables) cut
    into ``num_stages`` stages by ``partition_method`` ('parameters': balance trainable parameter
    counts; 'uniform': balance layer counts; 'type:REGEX': balance the layers whose class name
    matches). ``loss_fn(outputs, labels)`` runs on the last stage. ``activation_checkpoint_interval``
    > 0 recomputes each run of that many layers in backward (trainer.checkpointing.checkpoint).
    ``tp_size`` > 1: tensor parallelism inside each stage (the config's ``tensor_parallel.tp_size``
    says the same); the layers take ``self.groups.layers``, which ``stage_groups`` gives before the
    module is built. ``virtual_stages`` > 1: the interleaved schedule, each stage holding that many
    chunks of the model (Megatron's ``virtual_pipeline_model_parallel_size``); ``forward(x, chunk)``
    runs one of them."""

    def __init__(
        self,
        layers,
        num_stages: int | None = None,
        topology=None,
        loss_fn=None,
        seed_layers: bool = False,
        seed_fn=None,
        base_seed: int = 1234,
        partition_method: str = "parameters",
        activation_checkpoint_interval: int = 0,
        activation_checkpoint_func=None,
        checkpointable_layers=None,
        tp_size: int = 1,
        virtual_stages: int = 1,
    ):
        super().__init__()
        from trainer.checkpointing import checkpoint

        if topology is not None:
            raise PipelineError(
                "PipelineModule(topology=...): give num_stages and tp_size (stages x data x tensor parallel)"
            )
        self.groups = pipe_groups(num_stages, tp_size)
        self.num_stages = num_stages
        self.virtual_stages = _checked_virtual_stages(virtual_stages, num_stages)
        self.topology = self.groups.topology
        self.stage_id = self.topology.stage
        self.loss_fn = loss_fn
        self.seed_layers, self.seed_fn, self.base_seed = seed_layers, seed_fn, base_seed
        self.activation_checkpoint_interval = activation_checkpoint_interval
        self.activation_checkpoint_func = activation_checkpoint_func or checkpoint
        self.checkpointable_layers = checkpointable_layers
        self._layer_specs = list(layers)
        self.parts = self._partition(partition_method)  # per chunk of the model: num_stages * virtual_stages
        chunks = range(self.stage_id, len(self.parts) - 1, num_stages)
        self._local_ranges = [(self.parts[c], self.parts[c + 1]) for c in chunks]
        self.forward_funcs: list = []
        self._chunk_bounds = [0]  # local chunk c runs forward_funcs[bounds[c]:bounds[c + 1]]
        self.tied_modules = nn.ModuleDict()
        self.tied_weight_attrs: dict[str, list[str]] = {}
        self._build()
        self.tied_comms = self._tie_groups()
        self._synchronize_tied_weights()

    # ---------------------------------------------------------------- partitioning and build

    def _partition(self, method: str) -> list[int]:
        parts = self._partition_into(method, self.num_stages * self.virtual_stages)
        if self.virtual_stages > 1 and any(lo == hi for lo, hi in itertools.pairwise(parts)):
            raise PipelineError(
                f"PipelineModule(virtual_stages={self.virtual_stages}): partition_method {method!r} leaves a chunk "
                f"of the {self.num_stages} x {self.virtual_stages} without layers (boundaries {parts}; "
                f"{len(self._layer_specs)} layers)"
            )
        return parts

    def _partition_into(self, method: str, num_parts: int) -> list[int]:
        method = method.lower()
        if method == "uniform":
            return partition_uniform(len(self._layer_specs), num_parts)
        if method == "parameters":
            return partition_balanced(self._count_layer_params(), num_parts)
        if method.startswith("type:"):
            pattern = re.compile(method.split(":", 1)[1], re.IGNORECASE)
            weights = [1 if (n := _layer_name(s)) and pattern.search(n) else 0 for s in self._layer_specs]
            if not any(weights):
                raise PipelineError(f"partition_method {method!r}: no layer's class name matches")
            return partition_balanced(weights, num_parts)
        raise PipelineError(f"partition_method {method!r}: use 'parameters', 'uniform' or 'type:REGEX'")

    def _count_layer_params(self) -> list[int]:
        # Builds every LayerSpec once, as DeepSpeed does: the random draws (and so the weights built
        # after) match DeepSpeed's for the same script.
        counts = []
        for spec in self._layer_specs:
            layer = spec.build() if isinstance(spec, LayerSpec) else spec
            params = layer.parameters() if isinstance(layer, nn.Module) else ()
            counts.append(sum(p.numel() for p in params if p.requires_grad))
        return counts

    def _build(self) -> None:
        for lo, hi in self._local_ranges:
            for idx in range(lo, hi):
                self._build_layer(idx)
            self._chunk_bounds.append(len(self.forward_funcs))

    def _build_layer(self, idx: int) -> None:
        spec = self._layer_specs[idx]
        if self.seed_layers:
            (self.seed_fn or _set_seed)(self.base_seed + idx)
        if isinstance(spec, TiedLayerSpec):
            if spec.key not in self.tied_modules:
                self.tied_modules[spec.key] = spec.build()
                self.tied_weight_attrs[spec.key] = spec.tied_weight_attr
            module = self.tied_modules[spec.key]
            self.forward_funcs.append(module if spec.forward_fn is None else partial(spec.forward_fn, module))
        elif isinstance(spec, LayerSpec):
            module = spec.build()
            self.add_module(str(idx), module)
            self.forward_funcs.append(module)
        elif isinstance(spec, nn.Module):
            self.add_module(str(idx), spec)
            self.forward_funcs.append(spec)
        elif callable(spec):
            self.forward_funcs.append(spec)
        else:
            raise PipelineError(f"layer {idx} ({spec!r}) is not a LayerSpec, a module nor a callable")

    def _tie_groups(self) -> dict:
        """Per tied key this stage holds: the group of the stages sharing it (same data and tensor-parallel rank)."""
        out: dict = {}
        if self.num_stages == 1:
            return out
        keys = sorted({s.key for s in self._layer_specs if isinstance(s, TiedLayerSpec)})
        for key in keys:
            stages = sorted(
                {self.stage_owner(i) for i, s in enumerate(self._layer_specs) if getattr(s, "key", None) == key}
            )
            for ranks in self.topology.pipelines(stages):
                group = comm.new_group(ranks=ranks)  # every rank creates every group, in the same order
                if self.topology.rank in ranks:
                    out[key] = {"ranks": ranks, "group": group, "weight_attr": self.tied_weight_attrs[key]}
                    if self.topology.rank != ranks[0]:  # DeepSpeed's mark: the gradient norm counts it once
                        for p in self.tied_modules[key].parameters():
                            p.ds_pipe_replicated = True
        return out

    def _tied_weights(self):
        for key, tie in self.tied_comms.items():
            for attr in tie["weight_attr"]:
                yield _getattr_path(self.tied_modules[key], attr), tie

    def _synchronize_tied_weights(self) -> None:
        for weight, tie in self._tied_weights():
            if len(tie["ranks"]) > 1:
                comm.broadcast(weight.data, src=tie["ranks"][0], group=tie["group"], log_name="pipe.tied_broadcast")

    def allreduce_tied_weight_gradients(self) -> None:
        """Sum the tied weights' gradients over the stages sharing them."""
        for weight, tie in self._tied_weights():
            if len(tie["ranks"]) > 1 and weight.grad is not None:
                comm.all_reduce(weight.grad, group=tie["group"], log_name="pipe.tied_all_reduce")

    # ---------------------------------------------------------------- queries

    def partitions(self) -> list[int]:
        return self.parts

    def stage_owner(self, layer_idx: int) -> int:
        for chunk in range(len(self.parts) - 1):
            if self.parts[chunk] <= layer_idx < self.parts[chunk + 1]:
                return chunk % self.num_stages
        raise PipelineError(f"layer {layer_idx} is owned by no stage (parts={self.parts})")

    def owns_layer(self, layer_idx: int) -> bool:
        return any(lo <= layer_idx < hi for lo, hi in self._local_ranges)

    @property
    def num_local_layers(self) -> int:
        return sum(hi - lo for lo, hi in self._local_ranges)

    def set_checkpoint_interval(self, interval: int) -> None:
        if interval < 0:
            raise PipelineError("activation_checkpoint_interval must be >= 0")
        self.activation_checkpoint_interval = interval

    # ---------------------------------------------------------------- forward

    def _run(self, start: int, stop: int):
        def run(*inputs):
            x = inputs[0] if len(inputs) == 1 else inputs
            for layer in self.forward_funcs[start:stop]:
                x = layer(x)
            return x

        return run

    def _checkpointable(self, funcs) -> bool:
        if self.checkpointable_layers is not None:
            return any(type(f).__name__ in self.checkpointable_layers for f in funcs)
        return any(isinstance(f, nn.Module) and next(f.parameters(), None) is not None for f in funcs)

    def forward(self, forward_input, chunk: int = 0):
        """This stage's layers (of its local ``chunk`` with virtual stages) over ``forward_input`` (a
        tensor or a tuple of tensors)."""
        first, end = self._chunk_bounds[chunk], self._chunk_bounds[chunk + 1]
        every = self.activation_checkpoint_interval
        if every == 0 or not self.training:
            return self._run(first, end)(forward_input)
        x = forward_input
        for start in range(first, end, every):
            stop = min(start + every, end)
            args = x if isinstance(x, tuple) else (x,)
            if self._checkpointable(self.forward_funcs[start:stop]):
                x = self.activation_checkpoint_func(self._run(start, stop), *args)
            else:
                x = self._run(start, stop)(*args)
        return x


def _checked_virtual_stages(virtual_stages, num_stages: int) -> int:
    if not isinstance(virtual_stages, int) or isinstance(virtual_stages, bool) or virtual_stages < 1:
        raise PipelineError(f"PipelineModule(virtual_stages={virtual_stages!r}): must be an integer >= 1")
    if virtual_stages > 1 and num_stages < 2:
        raise PipelineError(
            f"PipelineModule(virtual_stages={virtual_stages}): the interleaved schedule needs num_stages >= 2 "
            f"(got {num_stages})"
        )
    return virtual_stages


def _layer_name(spec) -> str | None:
    if isinstance(spec, LayerSpec):
        return spec.typename.__name__
    if isinstance(spec, nn.Module):
        return type(spec).__name__
    return getattr(spec, "__name__", None)


def _getattr_path(obj, path: str):
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def _set_seed(seed: int) -> None:
    """DeepSpeed's set_random_seed: python, numpy and torch generators."""
    import numpy as np

    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
