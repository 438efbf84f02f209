"""The example GPT with one rank slowed down on purpose, to see what rankscope makes of it.

    RANKSCOPE_ENDPOINT=127.0.0.1:50051 torchrun --nproc_per_node 4 -m trainer.examples.faults \\
        --runs sleep:0 sleep:30 sleep:80 gc:40 sleep:40@40x80 --steps 12 --name slow

Each ``--runs`` entry ``FAULT:MS[@FROM][xSTEPS]`` is one run (``slow-sleep30``,
``slow-sleep40from40x80``), trained in the same processes one after the other, so the runs
differ only in the fault. Faults, on one rank only and from step FROM on:

- ``sleep``: waits ``--ms`` before each forward (a slow device or host), busy, so that on a
  CPU-only host its core is not handed to the other ranks meanwhile (see ``busy_wait``);
- ``gc``: makes cyclic garbage before each forward and collects it (a Python GC pause; the
  amount is scaled so the pause is about ``--ms``);
- ``data``: the data loader sleeps before each batch (slow storage, an expensive transform);
- ``cpu``: busy-looping processes share the rank's CPU and take ~90% of it (a noisy neighbour at
  a higher priority; see ``HOG_NICE``); ``--ms`` is unused.

``--times FILE`` makes rank 0 write each run's step wall times (seconds between the ends of
consecutive optimizer steps) as JSON: what the fault cost, measured from outside rankscope.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import multiprocessing
import os
import time

import torch
from torch.utils.data import Dataset

import trainer
from trainer.engine import init_distributed
from trainer.examples._common import CONFIG_DIR
from trainer.examples.gpt import GPT, synthetic_batch
from trainer.examples.scenarios import BLOCK_SIZE, VOCAB, _lm_loss

FAULTS = ("none", "sleep", "gc", "data", "cpu")
CYCLES_PER_MS = 100  # cycles per ms of pause asked for, besides the walk over every tracked object


class SyntheticSequences(Dataset):
    """gpt.synthetic_batch's sequences, one per index, so the engine's data loader serves them."""

    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, i: int):
        x, y = synthetic_batch(i, 0, 0, 1, VOCAB, BLOCK_SIZE, "cpu")
        return x[0], y[0]


class Fault:
    def __init__(self, kind: str, rank: int, ms: float, from_step: int) -> None:
        self.kind, self.rank, self.ms, self.from_step = kind, rank, ms, from_step
        self.engine = None
        self.here = int(os.environ.get("RANK", 0)) == rank and (ms > 0 or kind == "cpu")

    def active(self) -> bool:
        return self.here and self.engine is not None and self.engine.global_steps >= self.from_step

    def before_forward(self, module, args) -> None:
        if not self.active():
            return
        if self.kind == "sleep":
            busy_wait(self.ms / 1e3)
        elif self.kind == "gc":
            garbage = []
            for _ in range(int(self.ms * CYCLES_PER_MS)):
                a = []
                a.append(a)  # a reference cycle only the cyclic collector frees
                garbage.append(a)
            del garbage
            gc.collect()

    def collate(self, items):
        if self.kind == "data" and self.active():
            time.sleep(self.ms / 1e3)
        xs, ys = zip(*items, strict=True)
        return torch.stack(xs), torch.stack(ys)


def busy_wait(seconds: float) -> None:
    """A delay that keeps the CPU, as a slow device would keep its own: on a CPU-only host the
    ranks share cores, and a real sleep would hand this rank's core to the others, hiding part
    of the delay from the job (the others' compute speeds up while it sleeps)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


# The neighbour takes ~90% of the rank's CPU: one busy loop HOG_NICE nice levels above the rank
# (CFS weight 9548 against the rank's 1024 at nice 0), or, where raising a priority is not
# permitted (not root, no CAP_SYS_NICE), HOGS_UNPRIVILEGED busy loops at the rank's own priority
# (9 x 1024). Either way the rank's training thread keeps ~10% of its CPU. One loop at equal
# priority was not a fault on a small host: with 4 ranks on 2 cores it took half a core from the
# whole job (every rank slowed: median step 29 -> 50 ms, measured) while the rank's training
# thread kept 50% of its core and the 3 others shared the other core at ~33% each, so the rank
# itself was hardly later than the rest (5-6 ms a step) and its CPU wait per CPU-ms barely above
# theirs. At 10% it is 2-3x slower than the others whether the host is quiet (others ~33% of a
# core) or loaded by two more busy processes (~20%), and 10x on a host with a core per rank.
HOG_NICE = -10
HOGS_UNPRIVILEGED = 9


def _hog(cpu: int) -> None:
    os.sched_setaffinity(0, {cpu})
    while True:
        pass


def start_hog(fault: Fault) -> list[multiprocessing.Process]:
    """Busy loops pinned to the CPU this rank's training thread is pinned to, taking ~90% of it
    (see HOG_NICE). The caller restores the thread's affinity (``os.sched_getaffinity`` before)."""
    if fault.kind != "cpu" or not fault.here:
        return []
    cpu = max(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})  # the calling (training) thread; the rank's other threads float
    context = multiprocessing.get_context("fork")
    hogs = [context.Process(target=_hog, args=(cpu,), daemon=True)]
    hogs[0].start()
    nice = os.getpriority(os.PRIO_PROCESS, 0) + HOG_NICE  # HOG_NICE above the rank, whatever its own
    try:
        if nice < -20:  # beyond the highest priority: no such neighbour to be had
            raise PermissionError
        os.setpriority(os.PRIO_PROCESS, hogs[0].pid, nice)
    except PermissionError:
        hogs += [context.Process(target=_hog, args=(cpu,), daemon=True) for _ in range(HOGS_UNPRIVILEGED - 1)]
        for hog in hogs[1:]:
            hog.start()
    return hogs


def train_one(run: str, fault: Fault, steps: int) -> list[float]:
    os.environ["RANKSCOPE_RUN"] = run
    torch.manual_seed(0)
    model = GPT(layers=1)
    model.register_forward_pre_hook(fault.before_forward)
    with open(CONFIG_DIR / "zero2.json") as f:
        config = json.load(f)
    config["flops_profiler"] = {"enabled": False}
    config["train_micro_batch_size_per_gpu"] = 1
    engine, _, loader, _ = trainer.initialize(
        model=model, config=config, training_data=SyntheticSequences(), collate_fn=fault.collate
    )
    fault.engine = engine
    affinity = os.sched_getaffinity(0)
    hogs = start_hog(fault)
    ends, batches = [], iter(loader)
    try:
        for _ in range(steps):
            x, y = next(batches)
            loss = _lm_loss(engine(x), y)
            engine.backward(loss)
            engine.step()
            ends.append(time.perf_counter())
    finally:
        for hog in hogs:
            hog.kill()
            hog.join()
        os.sched_setaffinity(0, affinity)  # the next run starts unpinned
        engine.close()
    return [b - a for a, b in itertools.pairwise(ends)]


def parse_run(spec: str, steps: int) -> tuple[str, float, int, int]:
    """``FAULT:MS[@FROM][xSTEPS]``, e.g. ``sleep:30``, ``gc:40``, ``sleep:40@40x80``."""
    try:
        fault, rest = spec.split(":", 1)
        rest, _, n = rest.partition("x")
        ms, _, first = rest.partition("@")
        parsed = fault, float(ms), int(first or 0), int(n or steps)
    except ValueError:
        raise SystemExit(f"faults: --runs {spec!r}: expected FAULT:MS[@FROM][xSTEPS], e.g. sleep:40@40x80") from None
    if fault not in FAULTS:
        raise SystemExit(f"faults: --runs {spec!r}: fault must be one of {', '.join(FAULTS)}")
    return parsed


def main() -> None:
    p = argparse.ArgumentParser(description="The example GPT with one rank slowed down on purpose.")
    p.add_argument("--runs", nargs="+", default=["sleep:40"], help="FAULT:MS[@FROM][xSTEPS], one run each")
    p.add_argument("--slow-rank", type=int, default=3, help="the rank to slow down")
    p.add_argument("--steps", type=int, default=12, help="optimizer steps per run (unless the run says)")
    p.add_argument("--name", default="fault", help="run name prefix (torchrun would take --run)")
    p.add_argument("--times", default=None, help="rank 0 writes each run's step wall times (s) here as JSON")
    args = p.parse_args()
    runs = [parse_run(spec, args.steps) for spec in args.runs]
    init_distributed()
    times = {}
    for spec, (fault, ms, first, steps) in zip(args.runs, runs, strict=True):
        run = f"{args.name}-{spec.replace(':', '').replace('@', 'from')}"
        times[run] = train_one(run, Fault(fault, args.slow_rank, ms, first), steps)
        if int(os.environ.get("RANK", 0)) == 0:
            print(f"[faults] {run}: median step {1e3 * sorted(times[run])[len(times[run]) // 2]:.1f} ms", flush=True)
    if args.times and int(os.environ.get("RANK", 0)) == 0:
        with open(args.times, "w") as f:
            json.dump(times, f)


if __name__ == "__main__":
    main()
