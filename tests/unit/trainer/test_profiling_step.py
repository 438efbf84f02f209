"""The engine side of the flops profiler: the ``flops_profiler`` config block,
one profiled step (report on rank 0, one ``flops`` row per module), and the
bundled engine streaming the tree through a real collector into DuckDB.

Split by tier: what needs processes, sockets or seconds is in tests/integration/trainer/test_profiling_step.py."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from collector.data.schema import TABLES
from trainer.profiling import FlopsProfilerConfig, StepProfiler
from trainer.profiling.report import fmt_count


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Sequential(nn.Linear(64, 64), nn.Tanh()), nn.Linear(64, 4))


class Recorder:
    """A telemetry sink that keeps what it is given."""

    def __init__(self):
        self.calls: list[tuple[str, list[dict]]] = []

    def __call__(self, table, rows):
        self.calls.append((table, list(rows)))


def train_steps(sp: StepProfiler, model: nn.Module, steps: int, batch: int = 8) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(steps):
        sp.begin(step)
        x = torch.randn(batch, 16)
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        sp.end(step, fwd_ns=2_000_000, bwd_ns=4_000_000, step_ns=1_000_000, samples=batch)


def printed(report: str, key: str) -> str:
    return re.search(rf"^{re.escape(key)}:\s+(.+)$", report, re.M).group(1)


def test_config_defaults_validation_and_unknown_keys():
    assert FlopsProfilerConfig.from_dict({}) == FlopsProfilerConfig(
        enabled=False, profile_step=1, module_depth=-1, top_modules=1, detailed=True, output_file=None
    )
    for key, bad in [
        ("enabled", "yes"),
        ("profile_step", -1),
        ("profile_step", 1.5),
        ("module_depth", -2),
        ("top_modules", 0),
        ("detailed", 1),
        ("output_file", 3),
    ]:
        with pytest.raises(ValueError, match=rf"flops_profiler\.{key}"):
            FlopsProfilerConfig.from_dict({key: bad})
    with pytest.warns(UserWarning, match=r"flops_profiler\.recompute_fwd_factor"):
        FlopsProfilerConfig.from_dict({"enabled": True, "recompute_fwd_factor": 0.0})
    with pytest.raises(ValueError, match="flops_profiler: must be an object"):
        FlopsProfilerConfig.from_dict([1])
    with pytest.raises(ValueError, match="tp_size"):
        StepProfiler({}, make_model(), tp_size=0)


def test_disabled_or_other_steps_cost_nothing():
    model, sink = make_model(), Recorder()
    for cfg in ({}, {"enabled": False, "profile_step": 0}, {"enabled": True, "profile_step": 5}):
        sp = StepProfiler(cfg, model, sink=sink)
        for step in range(3):
            sp.begin(step)
            assert all(not m._forward_pre_hooks for m in model.modules())
            model(torch.randn(2, 16)).sum().backward()
            sp.end(step, fwd_ns=1, bwd_ns=1, step_ns=1, samples=2)
    assert sink.calls == []


def test_profiled_step_prints_the_report_and_emits_one_row_per_module(capsys):
    model, sink = make_model(), Recorder()
    sp = StepProfiler({"enabled": True, "profile_step": 1, "top_modules": 2}, model, sink=sink)
    train_steps(sp, model, steps=3)
    report = capsys.readouterr().out
    assert report.count("Profile Summary at step 1") == 1
    assert [table for table, _ in sink.calls] == ["flops"], "one batch, for the profiled step only"
    rows = sink.calls[0][1]

    assert [r["module"] for r in rows] == [name for name, _ in model.named_modules()]
    assert {c for r in rows for c in r} <= set(TABLES["flops"].column_types)
    root = rows[0]
    assert (root["module"], root["parent"], root["depth"], root["module_type"]) == ("", "", 0, "Sequential")
    assert printed(report, "fwd flops per rank") == fmt_count(root["flops"])
    assert printed(report, "fwd MACs per rank") == fmt_count(root["macs"], "MACs")
    assert root["macs"] == 8 * (16 * 64 + 64 * 64 + 64 * 4)  # batch 8 through three Linear layers
    by_name = {r["module"]: r for r in rows}
    assert by_name["2.0"]["parent"] == "2" and by_name["2.0"]["depth"] == 2
    assert by_name["2"]["parent"] == "" and by_name["2"]["depth"] == 1
    for r in rows:
        assert r["step"] == 1 and r["latency_ns"] > 0 and r["bwd_latency_ns"] > 0, r
        children = [c for c in rows if c["parent"] == r["module"] and c is not r]
        assert r["flops"] >= sum(c["flops"] for c in children)

    # the engine's timings, not the root module's, drive the summary
    assert printed(report, "fwd latency") == "2.00 ms"
    assert printed(report, "bwd latency") == "4.00 ms"
    assert printed(report, "step latency") == "1.00 ms"
    assert printed(report, "iter latency") == "7.00 ms"
    assert printed(report, "samples/second") == f"{8 / 7e-3:.2f}"
    achieved = "achieved FLOPS per rank = 3 * fwd flops per rank / iter latency"
    assert printed(report, achieved) == fmt_count(3 * root["flops"] / 7e-3, "FLOPS")

    assert not _get_current_dispatch_mode_stack()
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_output_file_and_tensor_parallel_totals(tmp_path, capsys):
    model, out = make_model(), tmp_path / "flops.txt"
    sp = StepProfiler({"enabled": True, "profile_step": 0, "output_file": str(out)}, model, tp_size=2, sink=Recorder())
    train_steps(sp, model, steps=1)
    assert capsys.readouterr().out == ""
    report = out.read_text()
    params = sum(p.numel() for p in model.parameters())
    assert printed(report, "model parallel size") == "2"
    assert printed(report, "params per rank") == fmt_count(params)
    assert printed(report, "params of model = params per rank * mp_size") == fmt_count(2 * params)
    flops = sp.rows[0]["flops"]
    assert printed(report, "fwd flops of model = fwd flops per rank * mp_size") == fmt_count(2 * flops)


def test_a_failing_sink_never_fails_training():
    def broken(table, rows):
        raise OSError("collector gone")

    model = make_model()
    sp = StepProfiler({"enabled": True, "profile_step": 0, "output_file": "/dev/null"}, model, sink=broken)
    with pytest.warns(UserWarning, match="collector gone"):
        train_steps(sp, model, steps=2)
    assert all(not m._forward_hooks for m in model.modules())
