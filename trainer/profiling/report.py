"""The text report: summary, aggregated profile per depth, detailed tree.

Counts get K/M/G/T prefixes and durations s/ms/us chosen per value, so a
0.3 ms leaf and a 2 s root both read naturally.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch.distributed as dist

from trainer.profiling.tree import ModuleProfile

_PREFIXES = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K"))


def fmt_count(n: float, unit: str = "") -> str:
    for scale, prefix in _PREFIXES:
        if abs(n) >= scale:
            return f"{n / scale:.2f} {prefix}{unit}"
    return f"{n:g} {unit}".rstrip()


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.2f} us"


def _rate(flops: float, seconds: float | None) -> str:
    return fmt_count(flops / seconds, "FLOPS") if seconds else "n/a"


def _seconds(ns: int | None) -> float | None:
    return None if ns is None else ns / 1e9


def _share(part: float | None, whole: float | None) -> str:
    return f"{100.0 * part / whole:.2f}%" if part is not None and whole else "n/a"


def _world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


@dataclass(frozen=True, kw_only=True)
class Summary:
    """Step-level numbers for the summary; the engine measures them, the
    standalone profiler falls back to the root module's own latencies."""

    step: int
    fwd_ns: int | None
    bwd_ns: int | None = None
    step_ns: int | None = None
    samples: int | None = None
    tp_size: int = 1


def render(
    root: ModuleProfile, summary: Summary, *, module_depth: int = -1, top_modules: int = 1, detailed: bool = True
) -> str:
    lines = _summary(root, summary) + _aggregated(root, module_depth, top_modules)
    if detailed:
        lines += _detailed(root, module_depth)
    lines.append("-" * 78)
    return "\n".join(lines)


def _summary(root: ModuleProfile, s: Summary) -> list[str]:
    world = _world_size()
    flops, fwd, bwd, opt = root.flops, _seconds(s.fwd_ns), _seconds(s.bwd_ns), _seconds(s.step_ns)
    timed = [t for t in (fwd, bwd, opt) if t is not None]
    iteration = sum(timed) if timed else None
    rows = [
        ("world size", world),
        ("data parallel size", max(world // s.tp_size, 1)),
        ("model parallel size", s.tp_size),
        ("batch size (samples per step)", s.samples if s.samples is not None else "n/a"),
        ("params per rank", fmt_count(root.params)),
        ("params of model = params per rank * mp_size", fmt_count(root.params * s.tp_size)),
        ("fwd MACs per rank", fmt_count(root.macs, "MACs")),
        ("fwd flops per rank", fmt_count(flops)),
        ("fwd flops of model = fwd flops per rank * mp_size", fmt_count(flops * s.tp_size)),
        ("fwd+bwd flops per rank = 3 * fwd flops (bwd estimated as 2 * fwd)", fmt_count(3 * flops)),
        ("fwd latency", fmt_duration(fwd)),
        ("bwd latency", fmt_duration(bwd)),
        ("fwd FLOPS per rank = fwd flops per rank / fwd latency", _rate(flops, fwd)),
        ("bwd FLOPS per rank = 2 * fwd flops per rank / bwd latency", _rate(2 * flops, bwd)),
        (
            "fwd+bwd FLOPS per rank = 3 * fwd flops per rank / (fwd+bwd latency)",
            _rate(3 * flops, fwd + bwd) if fwd is not None and bwd is not None else "n/a",
        ),
        ("step latency", fmt_duration(opt)),
        ("iter latency", fmt_duration(iteration)),
        (
            "achieved FLOPS per rank = 3 * fwd flops per rank / iter latency",
            _rate(3 * flops, iteration) if bwd is not None else "n/a",
        ),
        ("samples/second", f"{s.samples / iteration:.2f}" if s.samples and iteration else "n/a"),
    ]
    width = max(len(k) for k, _ in rows) + 2
    return [
        "-------------------------- rankscope Flops Profiler --------------------------",
        f"Profile Summary at step {s.step}:",
        "Notations: data parallel size (dp_size), model parallel size (mp_size), number of parameters (params),",
        "number of multiply-accumulate operations (MACs), number of floating-point operations (flops),",
        "floating-point operations per second (FLOPS), fwd latency (forward propagation latency),",
        "bwd latency (backward propagation latency), step (weights update latency),",
        "iter latency (sum of fwd, bwd and step latency)",
        "",
    ] + [f"{k + ':':<{width}}{v}" for k, v in rows]


def _by_depth(root: ModuleProfile) -> dict[int, list[ModuleProfile]]:
    depths: dict[int, list] = defaultdict(list)
    for p in root.walk():
        depths[p.depth].append(p)
    return depths


def _aggregated(root: ModuleProfile, module_depth: int, top_modules: int) -> list[str]:
    lines = [
        "",
        "----------------------------- Aggregated Profile per Module -----------------------------",
        f"Top {top_modules} modules in terms of params, MACs, fwd latency or bwd latency at different model depths:",
    ]
    for depth, profiles in sorted(_by_depth(root).items()):
        if module_depth >= 0 and depth > module_depth:
            break
        totals: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for p in profiles:  # same-type modules at one depth add up, e.g. all Linear at depth 3
            t = totals[p.module_type]
            t["params"] += p.params
            t["macs"] += p.macs
            t["fwd"] += p.fwd_ns
            t["bwd"] += p.bwd_ns or 0

        def top(key: str, fmt, totals=totals) -> dict[str, str]:
            best = sorted(totals.items(), key=lambda kv: kv[1][key], reverse=True)[:top_modules]
            return {name: fmt(v[key]) for name, v in best}

        lines += [
            f"depth {depth}:",
            f"    params      - {top('params', fmt_count)}",
            f"    MACs        - {top('macs', lambda n: fmt_count(n, 'MACs'))}",
            f"    fwd latency - {top('fwd', lambda ns: fmt_duration(ns / 1e9))}",
            f"    bwd latency - {top('bwd', lambda ns: fmt_duration(ns / 1e9))}",
        ]
    return lines


def _detailed(root: ModuleProfile, module_depth: int) -> list[str]:
    lines = [
        "",
        "------------------------------ Detailed Profile per Module ------------------------------",
        "Each module profile is listed after its name in the following order:",
        "params, percentage of total params, MACs, percentage of total MACs, flops, percentage of total flops,",
        "fwd latency, percentage of total fwd latency, bwd latency, percentage of total bwd latency, fwd FLOPS",
        "",
        "Note: 1. A module's numbers include functional calls in its own forward (e.g. F.softmax, a @ b),",
        "which are not submodules: they make up the difference between a parent and the sum of its children.",
        "2. Backward flops are not counted: they are estimated as 2 * fwd flops. Backward latency is measured.",
        "3. Latencies are summed over every call of a module during the profiled step.",
        "",
    ]

    def stats(p: ModuleProfile) -> str:
        return ", ".join(
            [
                fmt_count(p.params),
                f"{_share(p.params, root.params)} Params",
                fmt_count(p.macs, "MACs"),
                f"{_share(p.macs, root.macs)} MACs",
                fmt_count(p.flops),
                f"{_share(p.flops, root.flops)} flops",
                fmt_duration(p.fwd_ns / 1e9),
                f"{_share(p.fwd_ns, root.fwd_ns)} fwd latency",
                fmt_duration(_seconds(p.bwd_ns)),
                f"{_share(p.bwd_ns, root.bwd_ns)} bwd latency",
                _rate(p.flops, p.fwd_ns / 1e9),
            ]
        )

    def visit(p: ModuleProfile, indent: str) -> None:
        label = f"({p.name.rpartition('.')[2]}): {p.module_type}" if p.name else p.module_type
        shown = [c for c in p.children if module_depth < 0 or c.depth <= module_depth]
        if not shown:
            lines.append(f"{indent}{label}({stats(p)})")
            return
        lines.append(f"{indent}{label}(")
        lines.append(f"{indent}  {stats(p)}")
        for child in shown:
            visit(child, indent + "  ")
        lines.append(f"{indent})")

    visit(root, "")
    return lines
