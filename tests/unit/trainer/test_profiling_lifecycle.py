"""FlopsProfiler lifecycle (start/stop/reset/end leave the model exactly as it
was), get_model_profile, and the text report's sections and units."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn
from torch.overrides import _get_current_function_mode_stack
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
from torch.utils.flop_counter import FlopCounterMode

from trainer.profiling import FlopsProfiler, get_model_profile
from trainer.profiling.report import fmt_count, fmt_duration


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(8, 32),
        nn.GELU(),
        nn.Sequential(nn.LayerNorm(32), nn.Linear(32, 32), nn.Dropout(0.0)),
        nn.Linear(32, 4),
    )


HOOK_DICTS = (
    "_forward_hooks",
    "_forward_pre_hooks",
    "_backward_hooks",
    "_backward_pre_hooks",
    "_forward_hooks_always_called",
    "_forward_hooks_with_kwargs",
    "_state_dict_hooks",
)


def hook_state(model: nn.Module) -> list:
    state = [(name, attr, dict(getattr(m, attr))) for name, m in model.named_modules() for attr in HOOK_DICTS]
    state += [
        (name, p._backward_hooks, getattr(p, "_post_accumulate_grad_hooks", None))
        for name, p in model.named_parameters()
    ]
    return state


def no_mode_active() -> bool:
    return not _get_current_dispatch_mode_stack() and not _get_current_function_mode_stack()


def step(model, x):
    model(x).pow(2).mean().backward()


def test_end_profile_leaves_no_hooks_and_no_mode():
    model, x = make_model(), torch.randn(4, 8)
    before = hook_state(model)
    prof = FlopsProfiler(model)
    prof.start_profile()
    assert hook_state(model) != before, "profiling hooks the modules"
    step(model, x)
    assert no_mode_active(), "the counting mode is active only inside a forward"
    prof.stop_profile()
    flops = prof.get_total_flops()
    assert flops > 0
    prof.end_profile()
    assert hook_state(model) == before
    assert no_mode_active()
    step(model, x)  # an unprofiled step: nothing is counted, nothing is timed
    assert prof.get_total_flops() == flops
    assert prof.root.calls == 1


def test_stop_profile_stops_counting_and_reset_zeroes():
    model, x = make_model(), torch.randn(4, 8)
    prof = FlopsProfiler(model)
    prof.start_profile()
    model(x)
    once = prof.get_total_flops()
    model(x)
    assert prof.get_total_flops() == 2 * once
    prof.stop_profile()
    model(x)
    assert prof.get_total_flops() == 2 * once
    prof.reset_profile()
    assert prof.get_total_flops() == 0 and prof.get_total_duration() == 0
    prof.end_profile()


def test_a_failing_forward_does_not_leave_the_mode_behind():
    class Boom(nn.Module):
        def forward(self, x):
            raise RuntimeError("boom")

    model = nn.Sequential(nn.Linear(8, 8), nn.Sequential(Boom()))
    prof = FlopsProfiler(model)
    prof.start_profile()
    with pytest.raises(RuntimeError, match="boom"):
        model(torch.randn(2, 8))
    assert no_mode_active()
    prof.end_profile()
    assert no_mode_active()


def test_ignored_modules_are_charged_to_their_parent():
    model, x = make_model(), torch.randn(4, 8)
    prof = FlopsProfiler(model)
    prof.start_profile(ignore_list=[nn.GELU, nn.LayerNorm])
    model(x)
    types = {p.module_type for p in prof.root.walk()}
    assert "GELU" not in types and "LayerNorm" not in types
    inner = next(p for p in prof.root.walk() if p.name == "2")
    assert inner.flops - sum(c.flops for c in inner.children) == 5 * 4 * 32  # the layer norm
    prof.end_profile()
    with FlopCounterMode(display=False) as counter:
        model(x)
    assert 2 * prof.get_total_macs() == counter.get_total_flops()  # totals do not change
    with pytest.raises(TypeError, match="module types"):
        prof.start_profile(ignore_list=["GELU"])


def test_tied_weights_count_once():
    class TiedLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.head = nn.Embedding(10, 8), nn.Linear(8, 10, bias=False)
            self.head.weight = self.wte.weight

        def forward(self, idx):
            return self.head(self.wte(idx))

    model = TiedLM()
    prof = FlopsProfiler(model)
    prof.start_profile()
    model(torch.tensor([[1, 2, 3]]))
    assert prof.get_total_params() == 80 == sum(p.numel() for p in model.parameters())
    assert [(p.name, p.params) for p in prof.root.walk()] == [("", 80), ("wte", 80), ("head", 0)]
    assert prof.get_total_macs() == 3 * 8 * 10
    prof.end_profile()


def test_get_model_profile_returns_totals_and_validates_input(tmp_path, capsys):
    model = make_model()
    flops, macs, params = get_model_profile(model, input_shape=(4, 8), print_profile=False, as_string=False)
    with FlopCounterMode(display=False) as counter:
        model(torch.randn(4, 8))
    assert 2 * macs == counter.get_total_flops()
    assert params == sum(p.numel() for p in model.parameters())
    assert flops > 2 * macs  # bias adds, GELU, layer norm on top
    assert get_model_profile(model, args=[torch.randn(4, 8)], print_profile=False) == (
        fmt_count(flops),
        fmt_count(macs, "MACs"),
        fmt_count(params),
    )
    assert get_model_profile(model, kwargs={"input": torch.randn(4, 8)}, print_profile=False, as_string=False) == (
        flops,
        macs,
        params,
    )
    assert no_mode_active() and all(not m._forward_hooks for m in model.modules())

    out = tmp_path / "profile.txt"
    get_model_profile(model, input_shape=(4, 8), output_file=str(out))
    assert "Detailed Profile per Module" in out.read_text()
    assert capsys.readouterr().out == ""  # the file, not stdout

    for bad in [(4, -1), "4x8", ()]:
        with pytest.raises(ValueError, match="input_shape"):
            get_model_profile(model, input_shape=bad)
    with pytest.raises(ValueError, match="input_shape, args or kwargs"):
        get_model_profile(model)
    with pytest.raises(TypeError, match=r"nn\.Module"):
        get_model_profile(lambda x: x, input_shape=(1,))


def test_units_are_chosen_per_value():
    assert [fmt_count(n) for n in (0, 999, 1234, 5.6e6, 7.891e9, 2e12)] == [
        "0",
        "999",
        "1.23 K",
        "5.60 M",
        "7.89 G",
        "2.00 T",
    ]
    assert fmt_count(3.2e6, "MACs") == "3.20 MMACs"
    assert [fmt_duration(s) for s in (2.5, 0.0123, 4.5e-5, None)] == ["2.50 s", "12.30 ms", "45.00 us", "n/a"]


def test_report_has_three_sections_with_units_at_every_depth():
    model, x = make_model(), torch.randn(4, 8)
    prof = FlopsProfiler(model)
    prof.start_profile()
    step(model, x)
    prof.stop_profile()
    text = prof.print_model_profile(profile_step=3, top_modules=2, output_file="/dev/null")
    for section in ("Profile Summary at step 3", "Aggregated Profile per Module", "Detailed Profile per Module"):
        assert section in text
    assert re.search(r"fwd flops per rank:\s+[\d.]+ K\n", text)
    assert re.search(r"fwd MACs per rank:\s+[\d.]+ KMACs\n", text)
    assert "bwd estimated as 2 * fwd" in text
    tree = text.split("Detailed Profile per Module")[1]
    depth_lines = [line for line in tree.splitlines() if re.search(r"% Params", line)]
    assert len(depth_lines) == len(list(model.modules()))  # every module, every depth
    latency = r"[\d.]+ (s|ms|us)"
    for line in depth_lines:  # e.g. "  (0): Linear(288, 21.82% Params, 1.02 KMACs, ..."
        assert re.search(rf"{latency}, [\d.]+% fwd latency, {latency}, [\d.]+% bwd latency", line), line
        assert re.search(r"[\d.]+ ?[KMGT]?FLOPS\)?$", line), line
    assert re.search(r"depth 2:\n\s+params\s+- \{'Linear': '1.06 K', 'LayerNorm': '64'\}", text)

    shallow = prof.print_model_profile(module_depth=1, detailed=True, output_file="/dev/null")
    assert "(1): LayerNorm" not in shallow and "depth 2:" not in shallow
    assert "Detailed Profile" not in prof.print_model_profile(detailed=False, output_file="/dev/null")
    prof.end_profile()
    with pytest.raises(RuntimeError, match="start_profile"):
        FlopsProfiler(model).print_model_profile()
