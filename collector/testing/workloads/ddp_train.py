"""A plain DDP training script as people write it, with a fault injected on purpose; run unchanged
under the hook (the fault-injection suite, benches/faults.py, and tests):

    RANKSCOPE_RUN=job torchrun --nproc-per-node 2 -m collector.hook ddp_train.py OUT [--fault SPEC] ...

AdamW, gradient accumulation of ``--accum`` micro-batches with ``no_sync`` on all but the last,
and the usual ``dist.all_reduce(loss)`` to log the mean loss through ``hook.log``.

``--fault KIND:RANK[:MS][@FROM[-TO]][/EVERY]`` (several may be given): on RANK, from step FROM
(default 0) to TO (inclusive; default the end), on every EVERY-th step (default each):
- ``sleep``: busy-waits MS ms before the step's first forward (a slow rank; busy, as a slow
  device keeps its own time);
- ``data``: its batch loader sleeps MS ms before each step (slow storage; a real sleep);
- ``gc``: makes cyclic garbage and collects it before the step (a GC pause of about MS ms);
- ``hang``: stops before the step's collectives, forever (the others wait in them);
- ``exit``: the process exits (code 3) before the step: a crash;
- ``desync``: its logging all_reduce has one element more than the others' (a collective mismatch);
- ``nan``: the loss it logs is NaN; ``spike``: it logs the loss x MS (default 10);
- ``leak``: keeps MS MiB more every step (memory growth towards an OOM).

Every step also waits ``--device-ms`` (default 30) on every rank, asleep, as a GPU job's host waits
for its kernels: a step of realistic length, so a few ms of scheduler noise on a shared CPU host is
noise against it, as it is on a real job, not half a 5 ms CPU step.

Healthy shapes users write (no warning may come of them): ``--eval-every K`` (an eval pass on
all ranks with its own all_reduce), ``--save-every K`` (rank 0 saves a checkpoint, all ranks
barrier; with ``--save-ms MS`` each save takes that long, in ``torch.save``'s writes to slow
storage), ``--jitter-ms J`` (every rank busy 0..J ms at random each step), ``--first-step-ms M``
(a slow first step on every rank, as compilation or lazy allocation make it).

Writes ``OUT/times.json`` (rank 0: seconds between consecutive step ends), ``OUT/onset<rank>.json``
(the wall time a rank injected a fault first) and ``OUT/fr<rank>.json`` (Flight Recorder, when
``TORCH_FR_BUFFER_SIZE`` is set).
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from collector.rank import hook
from collector.testing import flight_recorder
from collector.testing.slow_storage import SlowStorage
from collector.testing.workloads import busy_wait

KINDS = ("sleep", "data", "gc", "hang", "exit", "desync", "nan", "spike", "leak")
BATCH, WIDTH, CLASSES = 16, 256, 10
GC_CYCLES_PER_MS = 400


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int
    ms: float = 0.0
    first: int = 0
    last: int | None = None
    every: int = 1

    def on(self, rank: int, step: int) -> bool:
        return (
            rank == self.rank
            and step >= self.first
            and (self.last is None or step <= self.last)
            and (step - self.first) % self.every == 0
        )


def parse_fault(spec: str) -> Fault:
    """``KIND:RANK[:MS][@FROM[-TO]][/EVERY]``, e.g. ``sleep:1:50@20``, ``sleep:1:50/4``, ``hang:1@15``."""
    try:
        head, _, every = spec.partition("/")
        head, _, window = head.partition("@")
        kind, rank, *ms = head.split(":")
        first, _, last = window.partition("-")
        fault = Fault(
            kind,
            int(rank),
            float(ms[0]) if ms else 0.0,
            int(first or 0),
            int(last) if last else None,
            int(every or 1),
        )
    except ValueError:
        raise SystemExit(f"ddp_train: --fault {spec!r}: expected KIND:RANK[:MS][@FROM[-TO]][/EVERY]") from None
    if fault.kind not in KINDS:
        raise SystemExit(f"ddp_train: --fault {spec!r}: KIND is one of {', '.join(KINDS)}")
    return fault


def gc_pause(ms: float) -> None:
    garbage = []
    for _ in range(int(ms * GC_CYCLES_PER_MS)):
        a = []
        a.append(a)  # a reference cycle only the cyclic collector frees
        garbage.append(a)
    del garbage
    gc.collect()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--fault", action="append", default=[], type=parse_fault)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--accum", type=int, default=2)
    p.add_argument("--eval-every", type=int, default=0)
    p.add_argument("--save-every", type=int, default=0)
    p.add_argument("--save-ms", type=float, default=0.0, help="each save takes this long (slow storage)")
    p.add_argument("--jitter-ms", type=float, default=0.0)
    p.add_argument("--first-step-ms", type=float, default=0.0)
    p.add_argument(
        "--device-ms",
        type=float,
        default=30.0,
        help="each step waits this long on every rank, as for a device's kernels (a sleep: the CPU stays free)",
    )
    args = p.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, CLASSES)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen, jitter = torch.Generator().manual_seed(rank), random.Random(rank)
    leaked, onset_written, ends = [], False, []

    def batch(step: int):
        for f in args.fault:
            if f.kind == "data" and f.on(rank, step):
                time.sleep(f.ms / 1e3)
        return torch.randn(BATCH, WIDTH, generator=gen), torch.randint(0, CLASSES, (BATCH,), generator=gen)

    for step in range(args.steps):
        active = [f for f in args.fault if f.on(rank, step)]
        if active and not onset_written:
            (out / f"onset{rank}.json").write_text(json.dumps({"time": time.time(), "step": step}))
            onset_written = True
        for f in active:
            if f.kind == "sleep":
                busy_wait(f.ms / 1e3)
            elif f.kind == "gc":
                gc_pause(f.ms)
            elif f.kind == "hang":
                while True:
                    time.sleep(1)
            elif f.kind == "exit":
                os._exit(3)
            elif f.kind == "leak":
                leaked.append(bytearray(int(f.ms * 2**20)))
        if step == 0 and args.first_step_ms:
            busy_wait(args.first_step_ms / 1e3)
        if args.jitter_ms:
            busy_wait(jitter.uniform(0, args.jitter_ms) / 1e3)
        if args.device_ms:
            time.sleep(args.device_ms / 1e3)
        total = torch.zeros(())
        for micro in range(args.accum):
            x, y = batch(step)
            if micro < args.accum - 1:
                with model.no_sync():
                    loss = torch.nn.functional.cross_entropy(model(x), y) / args.accum
                    loss.backward()
            else:
                loss = torch.nn.functional.cross_entropy(model(x), y) / args.accum
                loss.backward()
            total += loss.detach()
        opt.step()
        opt.zero_grad()
        if any(f.kind == "desync" for f in active):
            total = torch.zeros(2)  # one element more than the others' all_reduce
        dist.all_reduce(total)  # the mean loss over ranks, for the log
        mean = float(total.sum()) / world
        for f in active:
            if f.kind == "nan":
                mean = float("nan")
            elif f.kind == "spike":
                mean *= f.ms or 10.0
        hook.log({"loss": mean})
        if args.eval_every and (step + 1) % args.eval_every == 0:
            with torch.no_grad():
                ev = sum(torch.nn.functional.cross_entropy(model(x), y) for x, y in (batch(-1) for _ in range(4)))
            dist.all_reduce(ev)
            hook.log({"eval_loss": float(ev) / world / 4})
        if args.save_every and (step + 1) % args.save_every == 0:
            if rank == 0:
                with SlowStorage(args.save_ms / 1e3, out / "checkpoint.pt") as f:
                    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, f)
            dist.barrier()
        ends.append(time.perf_counter())
    if os.environ.get("TORCH_FR_BUFFER_SIZE"):
        flight_recorder.dump(out)
    if rank == 0:
        (out / "times.json").write_text(json.dumps([b - a for a, b in itertools.pairwise(ends)]))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
