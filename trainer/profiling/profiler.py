"""Per-module flops, MACs, params and forward/backward latency of a model.

How it attributes work to modules:
- forward pre/post hooks on every submodule keep a stack of the modules that
  are running; the innermost one is on top;
- while that stack is non-empty an ATen dispatch mode (``_OpCounter``) is
  active and charges every operator to the module on top (``counting.count``
  gives the formula), so ``F.linear``, ``a @ b``, ``einsum``, SDPA and any
  functional call inside a custom module land on that module;
- a module's totals are its own operators plus its children's totals, so a
  parent is never smaller than the sum of its children.

Backward flops are not counted: they are estimated as 2x forward. Backward
latency is measured per module call without changing the autograd graph
(module backward hooks would wrap tensors and break in-place ops): after the
forward, the autograd nodes the call created (from its outputs' grad_fn back to
its inputs' grad_fn, parameter AccumulateGrad nodes included) get hooks; the
first to run starts the call's backward, the last to finish ends it.

``end_profile()`` removes every hook, so a model that was profiled once costs
nothing afterwards.
"""

from __future__ import annotations

import time
import warnings

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from trainer.profiling import counting, report
from trainer.profiling.tree import BackwardCall, ModuleProfile


def _now_ns() -> int:
    # Kernels run asynchronously on an accelerator: wait for them so a module's
    # latency is its own. Only ever called while profiling.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return time.perf_counter_ns()


class _OpCounter(TorchDispatchMode):
    """Charges each ATen operator's flops/MACs to the innermost running module."""

    def __init__(self, profiler: FlopsProfiler):
        super().__init__()
        self.profiler = profiler
        self.warned = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        try:
            flops, macs = counting.count(func, args, kwargs, out)
        except Exception as e:  # an unexpected operator must never fail training
            if not self.warned:
                warnings.warn(f"flops profiler: could not count {func}: {e}; counted as 0", stacklevel=2)
                self.warned = True
            flops, macs = 0, 0
        # active only while a profiled forward runs, so the stack is never empty here
        top = self.profiler._stack[-1][0]
        top.own_flops += flops
        top.own_macs += macs
        return out


class _PassThrough(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


_dispatch_warm = False


def _warm_up_dispatch() -> None:
    """The first operator ever run under a Python dispatch mode costs seconds
    (PyTorch's one-time set-up), each new operator milliseconds. Pay that here,
    once per process and outside any timed forward, for the common operators."""
    global _dispatch_warm
    if _dispatch_warm:
        return
    x, q = torch.ones(2, 2), torch.ones(1, 1, 2, 2)
    with _PassThrough(), torch.no_grad():
        x + x, x * x, x / 2, x - x, x @ x, torch.bmm(x[None], x[None]), F.linear(x, x, x[0])
        F.layer_norm(x, (2,)), F.gelu(x), F.silu(x), x.tanh(), x.relu(), x.softmax(-1), x.sum(), x.mean(-1)
        F.scaled_dot_product_attention(q, q, q)
    _dispatch_warm = True


def _tensors(value) -> list[torch.Tensor]:
    return [t for t in tree_leaves(value) if isinstance(t, torch.Tensor) and t.requires_grad]


class FlopsProfiler:
    """DeepSpeed's FlopsProfiler API: start_profile / stop_profile / get_total_* /
    print_model_profile / end_profile around the steps you want measured."""

    def __init__(self, model: nn.Module):
        if not isinstance(model, nn.Module):
            raise TypeError(f"FlopsProfiler needs a torch.nn.Module, got {type(model).__name__}")
        self.model = model
        self.root: ModuleProfile | None = None
        self._handles: list = []
        self._stack: list[tuple[ModuleProfile, int]] = []
        self._counter: _OpCounter | None = None
        self._counting = False  # between start_profile and stop_profile

    # ------------------------------------------------------------------ lifecycle

    def start_profile(self, ignore_list=None) -> None:
        """Hook every module (except instances of the types in ``ignore_list``,
        whose work is charged to their parent) and start counting."""
        ignore = tuple(ignore_list or ())
        for t in ignore:
            if not isinstance(t, type):
                raise TypeError(f"ignore_list takes module types, got {t!r}")
        self.end_profile()
        _warm_up_dispatch()
        self._counter = _OpCounter(self)
        self.root = self._build_tree(ignore)
        self._counting = True

    def stop_profile(self) -> None:
        """Stop counting; the profile stays readable until end_profile()."""
        self._counting = False

    def reset_profile(self) -> None:
        """Zero the counts and latencies, keep the hooks."""
        if self.root is None:
            return
        for p in self.root.walk():
            p.own_flops = p.own_macs = p.calls = p.fwd_ns = 0
            p.backward_calls.clear()

    def end_profile(self) -> None:
        """Remove every hook: the model runs exactly as if never profiled."""
        self._counting = False
        for handle in self._handles:
            handle.remove()
        self._handles = []
        while self._stack:  # only if a forward was interrupted mid-way
            self._pop()

    # ------------------------------------------------------------------ results

    def get_total_flops(self, as_string: bool = False):
        n = self.root.flops if self.root else 0
        return report.fmt_count(n) if as_string else n

    def get_total_macs(self, as_string: bool = False):
        n = self.root.macs if self.root else 0
        return report.fmt_count(n, "MACs") if as_string else n

    def get_total_params(self, as_string: bool = False):
        n = self.root.params if self.root else sum(p.numel() for p in self.model.parameters())
        return report.fmt_count(n) if as_string else n

    def get_total_duration(self, as_string: bool = False):
        """Forward latency of the root module in seconds (summed over profiled calls)."""
        seconds = (self.root.fwd_ns if self.root else 0) / 1e9
        return report.fmt_duration(seconds) if as_string else seconds

    def print_model_profile(
        self,
        profile_step=1,
        module_depth=-1,
        top_modules=1,
        detailed=True,
        output_file=None,
        summary: report.Summary | None = None,
    ) -> str:
        """Print (or write to ``output_file``) the report and return its text.
        ``summary`` carries the engine's step timings; without it the root
        module's own forward/backward latencies are used."""
        if self.root is None:
            raise RuntimeError("print_model_profile() needs a profile: call start_profile() and run a forward first")
        if summary is None:
            summary = report.Summary(step=profile_step, fwd_ns=self.root.fwd_ns, bwd_ns=self.root.bwd_ns)
        text = report.render(self.root, summary, module_depth=module_depth, top_modules=top_modules, detailed=detailed)
        if output_file:
            with open(output_file, "w") as f:
                f.write(text + "\n")
        else:
            print(text, flush=True)
        return text

    # ------------------------------------------------------------------ hooks

    def _build_tree(self, ignore: tuple[type, ...]) -> ModuleProfile:
        by_name: dict[str, ModuleProfile] = {}
        counted: set[int] = set()  # a tied weight belongs to the first module that holds it
        for name, module in self.model.named_modules():  # parents before children
            own = [p for p in module.parameters(recurse=False) if id(p) not in counted]
            counted.update(id(p) for p in own)
            parent = None
            if name:
                parent_name = name.rpartition(".")[0]
                while parent_name not in by_name:  # skip ignored ancestors
                    parent_name = parent_name.rpartition(".")[0]
                parent = by_name[parent_name]
            if name and isinstance(module, ignore):
                parent.own_params += sum(p.numel() for p in own)
                continue
            profile = ModuleProfile(
                name=name,
                module_type=type(module).__name__,
                depth=parent.depth + 1 if parent else 0,
                parent=parent.name if parent else "",
            )
            if parent is not None:
                parent.children.append(profile)
            by_name[name] = profile
            self._hook(module, profile, own)
        return by_name[""]

    def _hook(self, module: nn.Module, profile: ModuleProfile, own_params: list[nn.Parameter]) -> None:
        def count_params():
            # ZeRO-3 frees partitioned parameters outside their module's forward;
            # its pre-hook (registered first) has gathered them when ours runs.
            profile.own_params = max(profile.own_params, sum(p.numel() for p in own_params))

        def pre(_module, _args):
            if self._counting:
                count_params()
                self._push(profile)

        def post(_module, args, kwargs, output):
            # pops even after stop_profile(), so the counting mode never outlives a forward
            if not (self._stack and self._stack[-1][0] is profile):
                return
            self._pop()
            if torch.is_grad_enabled():
                self._watch_backward(profile, (args, kwargs), output)

        count_params()
        self._handles += [
            module.register_forward_pre_hook(pre),
            module.register_forward_hook(post, with_kwargs=True, always_call=True),
        ]

    def _push(self, profile: ModuleProfile) -> None:
        self._stack.append((profile, _now_ns()))
        if len(self._stack) == 1:
            self._counter.__enter__()

    def _pop(self) -> None:
        profile, start = self._stack.pop()
        profile.fwd_ns += _now_ns() - start
        profile.calls += 1
        if not self._stack:
            self._counter.__exit__(None, None, None)

    def _watch_backward(self, profile: ModuleProfile, inputs, output) -> None:
        """Hook the autograd nodes this call created: those between its outputs'
        grad_fns and its inputs' grad_fns (parameter AccumulateGrad nodes
        included). The first of them to run starts the module's backward, the
        last to finish ends it. The hooks live and die with this step's graph."""
        heads = {t.grad_fn for t in _tensors(output) if t.grad_fn is not None}
        if not heads:
            return
        stop = {t.grad_fn for t in _tensors(inputs) if t.grad_fn is not None}
        if heads <= stop:  # e.g. Dropout(p=0) returns its input: no backward work of its own
            profile.backward_calls.append(BackwardCall(begin_ns=0, end_ns=0))
            return
        call = BackwardCall()
        profile.backward_calls.append(call)
        hooked = self._handles  # identity check: the profiler was not ended meanwhile

        def begin(*_):
            if self._handles is hooked and call.begin_ns is None:
                call.begin_ns = _now_ns()

        def end(*_):
            if self._handles is hooked:
                call.end_ns = _now_ns()

        seen, todo = set(), list(heads - stop)
        while todo:
            node = todo.pop()
            if node in seen or node in stop:
                continue
            seen.add(node)
            node.register_prehook(begin)
            node.register_hook(end)
            todo.extend(n for n, _ in node.next_functions if n is not None)


def get_model_profile(
    model: nn.Module,
    input_shape=None,
    args=None,
    kwargs=None,
    print_profile=True,
    detailed=True,
    module_depth=-1,
    top_modules=1,
    warm_up=1,
    as_string=True,
    output_file=None,
    ignore_modules=None,
):
    """Profile one forward pass of ``model`` (inference, no grad) -> (flops, macs, params).

    Give either ``input_shape`` (a tensor of that shape is the only positional
    argument) or ``args``/``kwargs``."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"get_model_profile needs a torch.nn.Module, got {type(model).__name__}")
    args = list(args or [])
    kwargs = dict(kwargs or {})
    if input_shape is not None:
        if not (
            isinstance(input_shape, (tuple, list))
            and input_shape
            and all(isinstance(d, int) and d > 0 for d in input_shape)
        ):
            raise ValueError(f"input_shape must be a non-empty tuple of positive ints, got {input_shape!r}")
        first = next(model.parameters(), None)
        dtype = first.dtype if first is not None and first.is_floating_point() else torch.get_default_dtype()
        device = first.device if first is not None else None
        args = [torch.randn(tuple(input_shape), dtype=dtype, device=device), *args]
    elif not args and not kwargs:
        raise ValueError("get_model_profile needs input_shape, args or kwargs to call the model with")
    if not isinstance(warm_up, int) or warm_up < 0:
        raise ValueError(f"warm_up must be a non-negative int, got {warm_up!r}")

    prof = FlopsProfiler(model)
    with torch.no_grad():
        for _ in range(warm_up):
            model(*args, **kwargs)
        prof.start_profile(ignore_list=ignore_modules)
        try:
            model(*args, **kwargs)
            prof.stop_profile()
            flops, macs, params = prof.get_total_flops(), prof.get_total_macs(), prof.get_total_params()
            if print_profile:
                prof.print_model_profile(
                    profile_step=warm_up,
                    module_depth=module_depth,
                    top_modules=top_modules,
                    detailed=detailed,
                    output_file=output_file,
                )
        finally:
            prof.end_profile()
    if as_string:
        return report.fmt_count(flops), report.fmt_count(macs, "MACs"), report.fmt_count(params)
    return flops, macs, params
