"""The MoE layer: gate, dispatch to experts over the expert-parallel group, combine.

Collective pattern for S tokens of width M on each rank, E experts, C slots
per expert, an expert-parallel group of ``ep`` ranks with E_local = E / ep
experts each (trainer.moe.groups)::

    routing  = gate(tokens)                                  # slot and weight per choice [k, S]
    fill     = all_to_all(kept tokens per expert, ep group)  # [ep * E_local] int64, async (CPU only, see below)
    buffers  = tokens copied into their slots                # [E, C, M] my tokens, by expert
    buffers  = all_to_all(buffers, ep group)                 # [ep, E_local, C, M] everyone's tokens for my experts
    outputs  = experts(buffers, fill)                        # [ep, E_local, C, M]
    outputs  = all_to_all(outputs, ep group)                 # [E, C, M] my tokens' results
    output   = sum_i weight_i * outputs[slot_i]              # [S, M]

Each all_to_all moves E*C*M elements per rank, of which (ep-1)/ep leave the
rank. Backward runs the same two all_to_alls in reverse. With ep == 1 both
are skipped (nothing leaves the rank).

Slots fill from 0 in every expert, so knowing how many are filled lets the
experts compute only those rows: on CPU the layer exchanges the fill counts
(ep > 1) or packs kept tokens back to back (ep == 1). That saves up to
1 - 1/capacity_factor of the expert FLOPs. On a GPU reading the counts would
stall the stream once per layer, so there the experts compute every slot.

PR-MoE (``use_residual``): output = a * moe(x) + b * mlp(x), with a dense copy
of the expert as ``mlp`` and (a, b) = softmax(Linear(hidden, 2)(x)) per token.
"""

from __future__ import annotations

import copy
import itertools

import torch
from torch import nn

from trainer import comm
from trainer.moe import dispatch as moe_dispatch
from trainer.moe import groups as moe_groups
from trainer.moe import telemetry as moe_telemetry
from trainer.moe.experts import Experts
from trainer.moe.gating import TopKGate

_layer_ids = itertools.count()


class _AllToAll(torch.autograd.Function):
    """all_to_all_single over ``group`` (equal chunks of dim 0); its gradient is the reverse all_to_all."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group, log_name: str) -> torch.Tensor:
        ctx.group, ctx.log_name = group, log_name
        x = x.contiguous()
        out = torch.empty_like(x)
        comm.all_to_all_single(out, x, group=group, log_name=log_name)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _AllToAll.apply(grad, ctx.group, ctx.log_name + ".backward"), None, None


class MoE(nn.Module):
    """DeepSpeed's ``deepspeed.moe.layer.MoE``: forward(x) -> (output, aux_loss, expert_counts).

    ``expert`` is any module mapping [..., hidden_size] to [..., hidden_size];
    this rank holds ``num_experts / ep_size`` copies of it. ``layer_id`` names
    the layer in the ``moe`` telemetry table (default: construction order).
    ``tp_size``: the tensor-parallel size of the surrounding model; expert
    parallelism then runs over the data-parallel ranks (trainer.moe.groups).
    """

    def __init__(
        self,
        hidden_size: int,
        expert: nn.Module,
        num_experts: int = 1,
        ep_size: int = 1,
        k: int = 1,
        capacity_factor: float = 1.0,
        eval_capacity_factor: float = 1.0,
        min_capacity: int = 4,
        use_residual: bool = False,
        noisy_gate_policy: str | None = None,
        drop_tokens: bool = True,
        use_rts: bool = True,
        top2_2nd_expert_sampling: bool = True,
        layer_id: int | None = None,
        tp_size: int = 1,
    ) -> None:
        super().__init__()
        checked = moe_groups.validate(num_experts, ep_size, comm.get_world_size(), tp_size)
        num_experts, ep_size = checked.num_experts, checked.ep_size
        self.groups = moe_groups.expert_groups(ep_size, tp_size)
        self.num_experts, self.ep_size = num_experts, ep_size
        self.num_local_experts = num_experts // ep_size
        ep_rank = comm.get_rank(self.groups.ep_group) if self.groups.ep_group is not None else 0
        self.layer_id = next(_layer_ids) if layer_id is None else layer_id
        self.gate = TopKGate(
            hidden_size,
            num_experts,
            k,
            capacity_factor,
            eval_capacity_factor,
            min_capacity,
            noisy_gate_policy,
            drop_tokens,
            use_rts,
            top2_2nd_expert_sampling,
            ep_group=self.groups.ep_group,
        )
        self.experts = Experts(expert, self.num_local_experts, ep_rank * self.num_local_experts, self.groups.name)
        self.use_residual = use_residual
        if use_residual:
            self.mlp = copy.deepcopy(expert)
            self.coefficient = nn.Linear(hidden_size, 2)

    def forward(self, hidden_states: torch.Tensor):
        output, aux_loss, counts = self._moe(hidden_states)
        if self.use_residual:
            coef = torch.softmax(self.coefficient(hidden_states), dim=-1)  # [..., 2]
            output = output * coef[..., 0:1] + self.mlp(hidden_states) * coef[..., 1:]
        return output, aux_loss, counts

    def _moe(self, x: torch.Tensor):
        M = x.shape[-1]
        tokens = x.reshape(-1, M)  # [S, M]
        routing = self.gate(tokens)
        slots = routing.slots.reshape(-1)  # [k*S], choice-major
        if self.ep_size == 1 and tokens.device.type == "cpu":
            out = self._packed(tokens, routing, slots)
        else:
            out = self._capacity_buffers(tokens, routing, slots)
        if self.training:
            moe_telemetry.record(self.layer_id, routing)
        return out.reshape(x.shape), routing.aux_loss, routing.expert_counts

    def _capacity_buffers(self, tokens: torch.Tensor, routing, slots: torch.Tensor) -> torch.Tensor:
        """GShard's fixed [E, C, M] buffers: every rank's chunk has one size, as all_to_all needs."""
        M = tokens.shape[1]
        E, C, ep = self.num_experts, routing.capacity, self.ep_size
        # On CPU the experts skip empty slots; the fill counts travel first, asynchronously, so their
        # latency hides behind the dispatch copy and all_to_all. (On a GPU, reading them would be a sync.)
        receive_fill = self._send_fill_counts(routing) if ep > 1 and tokens.device.type == "cpu" else None
        buffers = moe_dispatch.dispatch(tokens, slots, E * C).reshape(E, C, M)
        if ep > 1:
            buffers = _AllToAll.apply(buffers, self.groups.ep_group, "moe.dispatch")
        fill = receive_fill() if receive_fill is not None else None
        outputs = self.experts(buffers.reshape(ep, self.num_local_experts, C, M), fill).reshape(E, C, M)
        if ep > 1:
            outputs = _AllToAll.apply(outputs, self.groups.ep_group, "moe.combine")
        return moe_dispatch.combine(outputs.reshape(E * C, M), slots, routing.weights)  # [S, M]

    def _send_fill_counts(self, routing):
        """Start the all_to_all telling every rank how many slots of each of its experts I filled.
        Returns a function that waits for it and gives fill[r * E_local + i], rank r's count for
        my expert i: the layout the dispatch all_to_all delivers."""
        kept = routing.kept()
        fill = torch.empty_like(kept)
        work = comm.all_to_all_single(fill, kept, group=self.groups.ep_group, async_op=True, log_name="moe.fill_counts")

        def receive() -> list[int]:
            work.wait()
            return fill.tolist()

        return receive

    def _packed(self, tokens: torch.Tensor, routing, slots: torch.Tensor) -> torch.Tensor:
        """All experts local: pack each expert's kept tokens back to back, skipping the empty
        capacity slots (up to 1 - 1/capacity_factor of them) that the buffers would compute on.
        Slots fill from 0 in each expert, so slot e*C + c becomes row offset[e] + c. Needs the
        per-expert sizes on the host, hence CPU only (on a GPU that would be a sync per layer)."""
        E, C = self.num_experts, routing.capacity
        kept = routing.kept()  # [E] tokens each expert computes
        offset = torch.cumsum(kept, dim=0) - kept
        rows = int(kept.sum())
        expert = torch.div(slots, C, rounding_mode="floor").clamp_max(E - 1)
        packed = torch.where(slots < E * C, slots - expert * C + offset[expert], rows)
        outputs = self.experts.forward_packed(moe_dispatch.dispatch(tokens, packed, rows), kept.tolist())
        return moe_dispatch.combine(outputs, packed, routing.weights)


def pyramid_moe(
    hidden_size: int,
    expert: nn.Module,
    num_experts: list[int],
    ep_size: int | list[int] = 1,
    first_layer_id: int = 0,
    **moe_kwargs,
) -> nn.ModuleList:
    """PR-MoE's pyramid: one MoE per entry of ``num_experts`` (more experts near the
    output, e.g. [32, 32, 64, 64]), layer ids counting from ``first_layer_id``.
    ``ep_size`` is one size for all layers or one per layer."""
    if not isinstance(num_experts, (list, tuple)) or not num_experts:
        raise ValueError(
            f"moe.num_experts must be a non-empty list of expert counts per MoE layer, got {num_experts!r}"
        )
    ep_sizes = list(ep_size) if isinstance(ep_size, (list, tuple)) else [ep_size] * len(num_experts)
    if len(ep_sizes) != len(num_experts):
        raise ValueError(f"moe.ep_size has {len(ep_sizes)} entries but moe.num_experts has {len(num_experts)}")
    layers = nn.ModuleList()
    for i, (n, ep) in enumerate(zip(num_experts, ep_sizes)):
        try:
            layers.append(MoE(hidden_size, expert, n, ep, layer_id=first_layer_id + i, **moe_kwargs))
        except ValueError as e:
            raise ValueError(f"MoE layer {i}: {e}") from None
    return layers
