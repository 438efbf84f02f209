"""What counting steps costs a hook run: a training step (forward, backward, ``optimizer.step()``,
``zero_grad``) with the hook attached against the same step with nothing attached, in one process,
interleaved. Attached, torch's global optimizer post-hook counts the step, samples this rank's memory,
buffers the memory rows for a live collector and arms the wait between steps (one global forward
pre-hook, collector.rank.between_steps), which the next forward takes the time of, removes and
buffers as a row.

    python -m benches.step_hook [--steps 2000 --rounds 12]

A tiny model (Linear(4, 4), AdamW), so the step's own work is small and the added cost shows.
Reports the median per-step time of each variant over rounds and the difference, and the hooks'
work measured alone. Writes benches/RESULTS-steps.md.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _per_step_us(model, optimizer, x, steps: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(steps):
        model(x).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    return (time.perf_counter_ns() - t0) / steps / 1e3


def _post_hook_us(optimizer, steps: int) -> float:
    """The post-hook by itself (what attach adds to every optimizer step), called as torch calls it."""
    from collector.rank import steps as step_source

    on_step = step_source._counter.on_optimizer_step
    t0 = time.perf_counter_ns()
    for _ in range(steps):
        on_step(optimizer, (), {})
    return (time.perf_counter_ns() - t0) / steps / 1e3


def _between_steps_us(model, steps: int) -> float:
    """The wait between steps by itself: arm at a step's end (register the global forward pre-hook)
    and its first call (take the time, remove it, buffer the row), called as torch calls it."""
    from collector.rank import steps as step_source

    between = step_source._counter.between
    t0 = time.perf_counter_ns()
    for _ in range(steps):
        between.step_ended()
        between._first_forward(model, ())
    return (time.perf_counter_ns() - t0) / steps / 1e3


def measure(steps: int, rounds: int) -> dict[str, list[float]]:
    import torch

    from collector import hook
    from collector.rank import steps as step_source
    from collector.testing.collectors import live_collector

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    x = torch.ones(1, 4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    results: dict[str, list[float]] = {
        "raw": [],
        "attached": [],
        "attached_no_wait": [],
        "post_hook_alone": [],
        "between_steps_alone": [],
    }
    for var in ("RANK", "WORLD_SIZE"):
        os.environ.pop(var, None)
    with tempfile.TemporaryDirectory() as tmp, live_collector(Path(tmp) / "data") as (endpoint, _):
        _per_step_us(model, optimizer, x, steps)  # warm-up
        variants = ("raw", "attached", "attached_no_wait")
        for r in range(rounds):
            for variant in variants[r % 3 :] + variants[: r % 3]:  # each variant first in a third of the rounds
                if variant == "raw":
                    results[variant].append(_per_step_us(model, optimizer, x, steps))
                    continue
                hook.attach(run="bench-step-hook", endpoint=endpoint)
                if variant == "attached_no_wait":  # the same session, the wait between steps never armed
                    step_source._counter.between.step_ended = lambda: None
                results[variant].append(_per_step_us(model, optimizer, x, steps))
                if variant == "attached":
                    results["post_hook_alone"].append(_post_hook_us(optimizer, steps))
                    results["between_steps_alone"].append(_between_steps_us(model, steps))
                hook.detach()
            print(
                f"round {r + 1}/{rounds}: " + ", ".join(f"{v} {results[v][-1]:.2f} us" for v in variants),
                flush=True,
            )
    return results


def report(results: dict[str, list[float]], argv: list[str], elapsed_s: float, load: list[float]) -> str:
    from benches._common import code_version

    median = {k: statistics.median(v) for k, v in results.items()}
    diffs = [a - b for a, b in zip(results["attached"], results["raw"])]
    wait_diffs = [a - b for a, b in zip(results["attached"], results["attached_no_wait"])]
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return "\n".join(
        [
            "# Step counting in hook runs",
            "",
            f"- command: `python -m benches.step_hook {' '.join(argv)}`".rstrip() + f" ({elapsed_s:.0f} s, {now})",
            f"- machine: {platform.machine()} {os.cpu_count()}-core CPU VM shared with other jobs; "
            f"1-minute load average {' -> '.join(f'{x:.1f}' for x in load)} (start -> end); "
            f"Python {platform.python_version()}",
            f"- rankscope code: {code_version(ROOT)}",
            "- what: a training step (forward, backward, `optimizer.step()`, `zero_grad`) of AdamW over Linear(4, 4), "
            "one process; baseline: the same step with nothing attached, measured in the same rounds (rotating "
            "order). Attached: torch's global optimizer post-hook counts the step, samples this rank's RSS, buffers "
            "the memory row for a live collector and arms the wait between steps (a global forward pre-hook), which "
            "the next forward times, removes and buffers as a `between_steps` row; a third variant is the same "
            "session with the wait never armed.",
            "",
            "| variant | median µs per training step |",
            "|---|---|",
            f"| raw (baseline) | {median['raw']:.2f} |",
            f"| hook attached | {median['attached']:.2f} |",
            f"| hook attached, the wait between steps never armed | {median['attached_no_wait']:.2f} |",
            f"| added by attach (attached less raw, median of per-round differences) | "
            f"{statistics.median(diffs):.2f} |",
            f"| added by the wait between steps (attached less never armed, same) | "
            f"{statistics.median(wait_diffs):.2f} |",
            f"| the post-hook alone (counter, RSS read, memory row buffered, wait re-armed) | "
            f"{median['post_hook_alone']:.2f} |",
            f"| the wait between steps alone (pre-hook registered, first forward: time, remove, row buffered) | "
            f"{median['between_steps_alone']:.2f} |",
            "",
            f"Rounds: {len(diffs)}; attached less raw from {min(diffs):.2f} to {max(diffs):.2f} µs, attached less "
            f"never armed from {min(wait_diffs):.2f} to {max(wait_diffs):.2f} µs. The per-step hooks measured alone "
            "are their cost on the training thread, once per step (not per collective, not per module call). The "
            "in-step differences also carry the live session around the step (its background threads, which ship "
            "the rows, and its GC callback, on a 2-core machine shared with other jobs) and that machine's noise: "
            "see their ranges.",
        ]
    )


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benches.step_hook", description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=2000, help="optimizer steps per measurement")
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--out", default=str(HERE / "RESULTS-steps.md"))
    args = p.parse_args(argv)
    load = [os.getloadavg()[0]]
    t0 = time.monotonic()
    results = measure(args.steps, args.rounds)
    load.append(os.getloadavg()[0])
    text = report(results, argv, time.monotonic() - t0, load)
    Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
