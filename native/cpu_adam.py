"""CPUAdam: a fused, multi-threaded Adam/AdamW for fp32 master weights on the host.

The optimizer ZeRO-Offload runs on the CPU. Numerics are torch.optim.Adam's
(adamw_mode=False: L2 weight decay added to the gradient) or torch.optim.AdamW's
(adamw_mode=True: decoupled decay, p *= 1 - lr * wd), plus a bias_correction
switch torch doesn't have. `step(copy_to=[...])` also writes each updated
weight into an fp16/bf16 tensor in the same pass over memory, which is how the
offload engine refreshes the half-precision model copy.

The kernel is native/csrc/cpu_adam.cpp; without a compiler (or with
RANKSCOPE_NATIVE=off) the same update runs as torch ops, with the same results.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

import torch

from native import build

_kernel = build.load("cpu_adam")

#: "native" when the C++ kernel is in use, "torch" for the pure-torch fallback.
BACKEND = "native" if _kernel is not None else "torch"


def _adam_update_torch(
    param: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    step: int,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    bias_correction: bool,
    adamw_mode: bool,
    copy_out: torch.Tensor | None = None,
) -> None:
    """The fallback: torch.optim.Adam(W)'s single-tensor update, op for op."""
    if weight_decay != 0.0:
        if adamw_mode:
            param.mul_(1.0 - lr * weight_decay)
        else:
            grad = grad.add(param, alpha=weight_decay)
    exp_avg.lerp_(grad, 1.0 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
    bias_correction1 = 1.0 - beta1**step if bias_correction else 1.0
    bias_correction2 = 1.0 - beta2**step if bias_correction else 1.0
    denom = (exp_avg_sq.sqrt() / math.sqrt(bias_correction2)).add_(eps)
    param.addcdiv_(exp_avg, denom, value=-(lr / bias_correction1))
    if copy_out is not None:
        copy_out.copy_(param)


_adam_update = _kernel.adam_update if _kernel is not None else _adam_update_torch


def _check_copy_target(out: torch.Tensor, param: torch.Tensor, index: int) -> None:
    if (
        not isinstance(out, torch.Tensor)
        or out.device.type != "cpu"
        or out.dtype not in (torch.float16, torch.bfloat16)
        or not out.is_contiguous()
        or out.numel() != param.numel()
    ):
        got = (
            (f"{out.dtype} on {out.device}, {out.numel()} elements{'' if out.is_contiguous() else ', non-contiguous'}")
            if isinstance(out, torch.Tensor)
            else type(out).__name__
        )
        raise ValueError(
            f"CPUAdam.step: copy_to[{index}] must be a contiguous float16/bfloat16 CPU tensor "
            f"with {param.numel()} elements, got {got}"
        )


class CPUAdam(torch.optim.Optimizer):
    """Adam/AdamW on fp32 CPU tensors with an optional fused fp16/bf16 copy-out.

    Args:
        params: iterable of fp32 CPU tensors or param-group dicts.
        lr, betas, eps, weight_decay: as torch.optim.AdamW.
        adamw_mode: True for AdamW's decoupled decay, False for Adam's L2 decay.
        bias_correction: divide the moments by (1 - beta^t) as torch does.
        amsgrad: not supported; passing True raises ValueError.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        adamw_mode: bool = True,
        bias_correction: bool = True,
        amsgrad: bool = False,
    ):
        if amsgrad:
            raise ValueError("CPUAdam: amsgrad=True is not supported; use torch.optim.AdamW(amsgrad=True)")
        if not 0.0 <= lr:
            raise ValueError(f"CPUAdam: invalid lr={lr!r}, must be >= 0")
        if not 0.0 <= eps:
            raise ValueError(f"CPUAdam: invalid eps={eps!r}, must be >= 0")
        if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"CPUAdam: invalid betas={betas!r}, need two values in [0, 1)")
        if not 0.0 <= weight_decay:
            raise ValueError(f"CPUAdam: invalid weight_decay={weight_decay!r}, must be >= 0")
        defaults = dict(
            lr=lr,
            betas=tuple(betas),
            eps=eps,
            weight_decay=weight_decay,
            adamw_mode=adamw_mode,
            bias_correction=bias_correction,
        )
        super().__init__(params, defaults)
        for group_index, group in enumerate(self.param_groups):
            for param_index, p in enumerate(group["params"]):
                if p.device.type != "cpu" or p.dtype != torch.float32 or not p.is_contiguous():
                    raise ValueError(
                        f"CPUAdam: param_groups[{group_index}]['params'][{param_index}] must be a contiguous "
                        f"float32 CPU tensor (fp32 master weights), got {p.dtype} on {p.device}"
                        f"{'' if p.is_contiguous() else ', non-contiguous'}"
                    )

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None, copy_to: Sequence[torch.Tensor | None] | None = None):
        """One optimizer step.

        copy_to: optional list with one entry per parameter, in param_groups
            order; each entry is None or a float16/bfloat16 CPU tensor of the
            same size that receives the updated weights (cast) in the same pass.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        params = [p for group in self.param_groups for p in group["params"]]
        if copy_to is not None and len(copy_to) != len(params):
            raise ValueError(
                f"CPUAdam.step: copy_to has {len(copy_to)} entries but the optimizer has "
                f"{len(params)} parameters (one entry per parameter, None to skip)"
            )
        index = 0
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                out = copy_to[index] if copy_to is not None else None
                if out is not None:
                    _check_copy_target(out, p, index)
                index += 1
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("CPUAdam does not support sparse gradients")
                grad = p.grad if p.grad.dtype == torch.float32 else p.grad.float()
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
                # int() also accepts the tensor step of a torch.optim state_dict.
                state["step"] = int(state["step"]) + 1
                _adam_update(
                    p,
                    grad.contiguous(),
                    state["exp_avg"],
                    state["exp_avg_sq"],
                    state["step"],
                    group["lr"],
                    beta1,
                    beta2,
                    group["eps"],
                    group["weight_decay"],
                    group["bias_correction"],
                    group["adamw_mode"],
                    out.view(p.shape) if out is not None else None,
                )
        return loss
