"""Imported torch.profiler traces judged as hooked runs are: healthy DDP and FSDP2 jobs get no
warning, a slow rank is named with its cost (issue 44, item 5).

Each round runs ``collector/testing/workloads/profiled_train.py`` (a script that knows nothing of
rankscope: torch.profiler with torch's own ``tensorboard_trace_handler``) on 2 gloo ranks under
torchrun, for DDP and FSDP2, healthy and with rank 1 busy ``--slow-ms`` before every step:

- ``plain``: the script alone; its traces imported (`rankscope import`) and judged (`rankscope health`);
- ``hooked``: the same script under the hook, streaming to a real collector while the profiler
  records, so one run has two verdicts: from its traces and from the hook. They must agree.

A verdict is right when a healthy run has no warning and a slow run has one straggler finding, on
rank 1, its cost within ±25% of ``--slow-ms`` (the time the others wait for it each step); for the
hooked run's traces, within ±25% of the hook's cost for the same run.

    python -m benches.torch_profiler_health [--rounds 5 --steps 30 --device-ms 30 --slow-ms 40]
Writes benches/RESULTS-torch-profiler-health.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benches._common import code_version, publish

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SCRIPT = ROOT / "collector" / "testing" / "workloads" / "profiled_train.py"
COST_TOLERANCE = 0.25
MODES = ("ddp", "fsdp2")


def train(out: Path, mode: str, args, slow: bool, endpoint: str | None) -> None:
    """One run of the script under torchrun (under the hook when ``endpoint`` is given)."""
    from collector.testing.ports import free_port

    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", f"--master-port={free_port()}"]
    if endpoint:
        env.update(RANKSCOPE_ENDPOINT=endpoint, RANKSCOPE_RUN=f"{mode}-hooked")
        cmd += ["-m", "collector.hook"]
    cmd += [str(SCRIPT), str(out), "--mode", mode, "--steps", str(args.steps), "--device-ms", str(args.device_ms)]
    if slow:
        cmd += ["--slow-rank", "1", "--slow-ms", str(args.slow_ms)]
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{mode} run failed ({done.returncode}):\n{done.stderr[-3000:]}")


def warnings(data_dir: Path) -> list[dict]:
    """`rankscope health --json` of the data dir's only run: its warnings and worse."""
    from collector.data import catalog

    con = catalog.connect(data_dir)
    try:
        (run,) = con.execute("SELECT run_id FROM runs").fetchone()
    finally:
        con.close()
    cmd = [sys.executable, "-m", "collector.tools.cli", "health", run, "--json", "--no-live", "--data-dir"]
    done = subprocess.run([*cmd, str(data_dir)], capture_output=True, text=True, timeout=300)
    if done.returncode not in (0, 1, 2):
        raise RuntimeError(f"rankscope health failed ({done.returncode}): {done.stderr[-2000:]}")
    return [f for f in json.loads(done.stdout) if f["severity"] != "info"]


def imported(traces: Path, into: Path) -> list[dict]:
    done = subprocess.run(
        [sys.executable, "-m", "collector.tools.cli", "import", str(traces), "--data-dir", str(into)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        raise RuntimeError(f"rankscope import failed ({done.returncode}): {done.stderr[-2000:]}")
    return warnings(into)


def judged(found: list[dict], slow: bool, expected_ms: float | None) -> tuple[bool, str]:
    """(right, what it said in short). The profiler's own event buffers grow a process's memory
    through the run, which the hook's memory samples show (a memory_growth finding, true of the
    run); traces carry no memory samples, so that finding is said but not judged."""
    said = "; ".join(f"{f['kind']} {f['ranks']} {f.get('cost_ms_per_step') or 0:.0f} ms" for f in found) or "healthy"
    found = [f for f in found if f["kind"] != "memory_growth"]
    if not slow:
        return not found, said
    right = len(found) == 1 and found[0]["kind"] == "straggler" and found[0]["ranks"] == [1]
    if right and expected_ms:
        right = abs(found[0]["cost_ms_per_step"] - expected_ms) <= COST_TOLERANCE * expected_ms
    return right, said


def straggler_cost(found: list[dict]) -> float | None:
    return next((f["cost_ms_per_step"] for f in found if f["kind"] == "straggler"), None)


def one_round(tmp: Path, mode: str, slow: bool, args) -> dict:
    from collector.testing.collectors import live_collector

    name = f"{mode}-{'slow' if slow else 'healthy'}"
    plain = tmp / f"{name}-plain"
    train(plain, mode, args, slow, None)
    hooked = tmp / f"{name}-hooked"
    with live_collector(hooked / "live") as collector:
        train(hooked, mode, args, slow, collector.endpoint)
    hook = warnings(hooked / "live")
    return {
        "case": name,
        "plain": judged(imported(plain / "traces", plain / "d"), slow, args.slow_ms),
        # the hooked run's rank 1 also shares the CPU with the hook and the collector: its traces'
        # cost is held to the hook's measure of the same steps, not to the busy-wait's length
        "traces": judged(imported(hooked / "traces", hooked / "d"), slow, straggler_cost(hook)),
        "hook": judged(hook, slow, args.slow_ms),
    }


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benches.torch_profiler_health", description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--device-ms", type=float, default=30.0)
    p.add_argument("--slow-ms", type=float, default=40.0)
    p.add_argument("--out", default=str(HERE / "RESULTS-torch-profiler-health.md"))
    args = p.parse_args(argv)

    load, start, results = [os.getloadavg()[0]], time.time(), []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for mode in MODES:
                for slow in (False, True):
                    res = one_round(Path(tmp) / f"r{r}", mode, slow, args)
                    results.append(res)
                    print(f"round {r + 1}: {res}", file=sys.stderr, flush=True)
            load.append(os.getloadavg()[0])

    cases = sorted({r["case"] for r in results})
    lines = [
        "# Imported torch.profiler traces judged like hooked runs",
        "",
        f"- command: `{' '.join(['python -m benches.torch_profiler_health', *argv])}`",
        f"- measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(start))}, {code_version(ROOT)}, "
        f"{os.cpu_count()}-core VM, no GPU (1-minute load {min(load):.1f}-{max(load):.1f}), "
        f"{time.time() - start:.0f} s in all",
        f"- each run: `collector/testing/workloads/profiled_train.py`, 2 gloo ranks under torchrun, {args.steps} steps "
        f"({args.steps - 2} recorded by torch.profiler), {args.device_ms:g} ms asleep per step for the device; "
        f"slow: rank 1 busy {args.slow_ms:g} ms before each step",
        "- right: healthy -> no warning; slow -> one straggler finding, rank 1, cost within "
        f"±{COST_TOLERANCE:.0%} of {args.slow_ms:g} ms (the hooked run's traces: of the hook's cost); "
        "a memory_growth finding from the hook (the profiler's buffers) is listed, not judged",
        "- plain: the script alone, its traces imported; traces / hook: one run under the hook with the profiler on, "
        "judged from its traces and from the hook's records",
        "",
        "| case | plain traces right | hooked run: traces right | hooked run: hook right | verdicts agree |",
        "|---|---:|---:|---:|---:|",
    ]
    for case in cases:
        rows = [r for r in results if r["case"] == case]
        n = len(rows)
        agree = sum(r["traces"][0] == r["hook"][0] for r in rows)
        lines.append(
            f"| {case} | {sum(r['plain'][0] for r in rows)}/{n} | {sum(r['traces'][0] for r in rows)}/{n} | "
            f"{sum(r['hook'][0] for r in rows)}/{n} | {agree}/{n} |"
        )
    lines += ["", "What each said (plain / traces / hook):", ""]
    for r in results:
        lines.append(f"- {r['case']}: {r['plain'][1]} / {r['traces'][1]} / {r['hook'][1]}")
    publish(args.out, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
