"""ZeRO-3 leaf modules: gather a whole subtree's parameters as one unit.

By default ZeRO-3 gathers the parameters of every module that owns some, one
all_gather per Linear and LayerNorm, forward and backward. A *leaf* module
(DeepSpeed's "z3 leaf") is gathered as a whole in its own forward: a transformer
block then costs one all_gather instead of six, the granularity of FSDP's
``fully_shard(block)``, at the price of holding the whole block's weights.

Two ways to mark leaves, as in DeepSpeed:

- ``set_z3_leaf_modules(model, [Block])``: every module of those classes;
- ``zero_optimization.stage3_module_granularity_threshold = T``: walking from the
  root, the first module on each path whose granularity -- parameters in its
  subtree // (modules with parameters in it, itself counted) -- is at most T.
  Torch leaf modules and containers (ModuleList, Sequential, ...) are never
  marked; a subtree over 1e9 parameters is never one unit.

nn.MultiheadAttention is always a leaf: its forward uses out_proj's weight itself.
"""

from __future__ import annotations

import sys

from torch import nn

_LEAF_ATTR = "_z3_leaf"  # DeepSpeed's attribute name, so a model marked for either engine works in both
_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict, nn.ParameterList, nn.ParameterDict)
_MAX_LEAF_PARAMS = 10**9
# Modules whose own forward reads their children's parameters (MultiheadAttention passes
# out_proj.weight to F.multi_head_attention_forward): only correct as one unit.
ALWAYS_LEAF = (nn.MultiheadAttention,)


def set_z3_leaf_modules(model: nn.Module, leaf_classes: list[type]) -> list[nn.Module]:
    """Mark every submodule of ``model`` that is an instance of ``leaf_classes``; returns them."""
    classes = tuple(leaf_classes)
    if not classes or not all(isinstance(c, type) and issubclass(c, nn.Module) for c in classes):
        raise ValueError(f"set_z3_leaf_modules needs nn.Module subclasses, got {leaf_classes!r}")
    marked = [m for m in model.modules() if isinstance(m, classes)]
    for m in marked:
        setattr(m, _LEAF_ATTR, True)
    return marked


def z3_leaf_module(module: nn.Module) -> bool:
    return getattr(module, _LEAF_ATTR, False) is True or isinstance(module, ALWAYS_LEAF)


def mark_by_granularity(model: nn.Module, threshold: int) -> list[nn.Module]:
    """DeepSpeed's stage3_module_granularity_threshold rule (see the module docstring)."""
    granularity: dict[int, int] = {}

    def measure(m: nn.Module) -> tuple[int, int]:  # (modules with parameters, parameters) in the subtree
        own = sum(p.numel() for p in m.parameters(recurse=False))
        children = list(m.children())
        if not children:
            granularity[id(m)] = sys.maxsize
            return (1, own) if own else (0, 0)
        layers, params = 0, own
        for c in children:
            n, p = measure(c)
            layers, params = layers + n, params + p
        if not params or isinstance(m, _CONTAINERS):
            granularity[id(m)] = sys.maxsize
            return layers, params
        layers += 1
        granularity[id(m)] = params // layers if params <= _MAX_LEAF_PARAMS else sys.maxsize
        return layers, params

    marked: list[nn.Module] = []

    def mark(m: nn.Module) -> None:
        if granularity[id(m)] <= threshold:
            setattr(m, _LEAF_ATTR, True)
            marked.append(m)
            return
        for c in m.children():
            mark(c)

    measure(model)
    mark(model)
    return marked


def unit_modules(model: nn.Module) -> dict[int, nn.Module]:
    """id(module) -> the module whose hooks gather its parameters: its outermost leaf
    ancestor (itself included), else the module itself."""
    out: dict[int, nn.Module] = {}

    def walk(m: nn.Module, leaf: nn.Module | None) -> None:
        leaf = leaf if leaf is not None else (m if z3_leaf_module(m) else None)
        out[id(m)] = leaf if leaf is not None else m
        for c in m.children():
            walk(c, leaf)

    walk(model, None)
    return out
