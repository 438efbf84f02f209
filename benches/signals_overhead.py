"""Rank-side cost of the root-cause signals (GC pauses, host/run-queue samples, data wait) on the
example GPT under the bundled engine: samples/s with them on vs off, alternating rounds in one run.

    python -m benches.signals_overhead [--rounds 10] [--steps 40] [--out benches/RESULTS-signals.md]

One process, a world of one, telemetry streaming to a real collector process; the engine's data
loader (so the ``data`` timer runs in both arms). Each round trains ``--steps`` steps with the
signals on (the GC callback installed, the sampler thread reading /proc every 0.1 s) or off
(``collector.rank.signals.SIGNALS`` stopped), alternating, so drift in the machine's load falls
on both arms alike. Target: on / off >= 0.99.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from benches._common import code_version
from benches.dashboard_queries import machine
from collector.tools.launch import CollectorProcess

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=10, help="rounds per arm")
    ap.add_argument("--steps", type=int, default=40, help="optimizer steps per round")
    ap.add_argument("--out", default=str(REPO / "benches" / "RESULTS-signals.md"))
    args = ap.parse_args()
    torch.set_num_threads(1)

    import trainer
    from collector.rank.signals import SIGNALS
    from trainer.examples._common import CONFIG_DIR
    from trainer.examples.faults import Fault, SyntheticSequences
    from trainer.examples.gpt import GPT
    from trainer.examples.scenarios import _lm_loss

    with tempfile.TemporaryDirectory(prefix="rankscope-bench-") as tmp, CollectorProcess(Path(tmp)) as collector:
        os.environ.update(RANKSCOPE_ENDPOINT=collector.address, RANKSCOPE_RUN="bench-signals")
        torch.manual_seed(0)
        config = json.loads((CONFIG_DIR / "zero2.json").read_text())
        config["flops_profiler"] = {"enabled": False}
        config["train_micro_batch_size_per_gpu"] = 8
        engine, _, loader, _ = trainer.initialize(
            model=GPT(layers=2),
            config=config,
            training_data=SyntheticSequences(),
            collate_fn=Fault("none", -1, 0, 0).collate,
        )
        batches = iter(loader)

        def round_samples_per_s() -> float:
            t0 = time.perf_counter()
            for _ in range(args.steps):
                x, y = next(batches)
                engine.backward(_lm_loss(engine(x), y))
                engine.step()
            return args.steps * engine.train_batch_size() / (time.perf_counter() - t0)

        round_samples_per_s()  # warm-up
        load = [os.getloadavg()[0]]
        on, off = [], []
        for i in range(2 * args.rounds):
            if i % 2 == 0:
                SIGNALS.start()
                on.append(round_samples_per_s())
            else:
                SIGNALS.stop()
                off.append(round_samples_per_s())
        SIGNALS.start()
        engine.close()
        load.append(os.getloadavg()[0])
    ratio = statistics.median(on) / statistics.median(off)
    paired = statistics.median(a / b for a, b in zip(on, off, strict=True))  # each on round against the off after it
    lines = [
        "# Rank-side cost of the root-cause signals",
        "",
        f"Measured {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC on a {machine()}, shared with other jobs "
        f"(1-minute load average {load[0]:.1f} at the start, {load[1]:.1f} at the end). Code: {code_version(REPO)}.",
        f"Command: `python -m benches.signals_overhead --rounds {args.rounds} --steps {args.steps}`",
        "",
        "Example GPT (2 layers), bundled engine ZeRO-2 config, world of one, micro batch 8, telemetry to a live "
        f"collector process; {args.rounds} alternating rounds of {args.steps} steps per arm.",
        "",
        "| arm | median samples/s | min | max |",
        "|---|---:|---:|---:|",
        f"| signals on | {statistics.median(on):.1f} | {min(on):.1f} | {max(on):.1f} |",
        f"| signals off (baseline, same run) | {statistics.median(off):.1f} | {min(off):.1f} | {max(off):.1f} |",
        "",
        f"Ratio on / off: **{ratio:.3f}** of the medians, {paired:.3f} median of paired rounds (target >= 0.99). "
        "Rounds on this shared machine swing by 2x or more; read the ratio, not the absolute figures.",
    ]
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
