"""``rankscope simulate``: its flags; the simulation is collector/tools/simulate."""

from __future__ import annotations

import argparse
import sys
import time

from collector.tools.commands.common import data_dir_arg

NAME = "simulate"
HELP = "Generate a synthetic run of many ranks (a real ZeRO-2 step, repeated), into a data dir or a collector."
EXAMPLES = """
    rankscope simulate --ranks 1024 --steps 200 --straggler 517:40 --data-dir /tmp/sim
    rankscope simulate --ranks 256 --steps 1000 --endpoint 127.0.0.1:50051
    rankscope simulate --ranks 8192 --steps 100 --hosts 1024 --straggler 17:25@50 --data-dir /tmp/sim8k
    rankscope simulate --ranks 1024 --hosts 128 --steps 120 --slow-link 17:4@60-90 --data-dir /tmp/simlink
    rankscope simulate --ranks 1024 --hosts 128 --steps 60 --world-only --slow-link 17:4@30 --data-dir /tmp/simddp
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    data_dir_arg(p)
    p.add_argument("--ranks", type=int, required=True, help="world size")
    p.add_argument("--steps", type=int, required=True, help="training steps per rank")
    p.add_argument(
        "--collectives-per-step",
        type=int,
        default=0,
        metavar="C",
        help="collectives a step (default: one template step, ZeRO-2's 7); more repeats the pattern",
    )
    p.add_argument("--hosts", type=int, default=0, help="hosts the ranks are spread over (default: 8 ranks a host)")
    p.add_argument(
        "--straggler",
        action="append",
        default=[],
        metavar="RANK:MS[@STEP]",
        help="RANK's forward pass is MS slower (from STEP on); may be given several times",
    )
    p.add_argument(
        "--hang",
        default=None,
        metavar="RANK:STEP",
        help="RANK stops before STEP's first collective while the others enter it and wait (a hang, current now)",
    )
    p.add_argument(
        "--slow-link",
        action="append",
        default=[],
        metavar="HOST:FACTOR@STEP[-END]",
        help="host HOST's link is FACTOR times slower from STEP (to END, when it is restored); "
        "implies --host-groups unless --world-only",
    )
    p.add_argument(
        "--world-only",
        action="store_true",
        help="the world is the run's only group, as in plain DDP/FSDP: --slow-link adds no host groups",
    )
    p.add_argument(
        "--telemetry-apart",
        action="store_true",
        help="--data-dir: the ranks' telemetry takes another network than the training traffic "
        "(a management Ethernet beside InfiniBand): no slow link delays its arrival",
    )
    p.add_argument(
        "--host-groups",
        action="store_true",
        help="each step also all_reduces inside each host and between neighbouring hosts (what --slow-link slows)",
    )
    p.add_argument("--name", default="simulated", help="run name (default: simulated)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--endpoint", default=None, help="stream through the collector at HOST:PORT instead of --data-dir")
    p.add_argument("--token", default=None, help="bearer token for --endpoint (default: $RANKSCOPE_TOKEN)")
    p.add_argument("--streams", type=int, default=128, help="--endpoint: rank streams open at once (default 128)")


def run(args: argparse.Namespace) -> int:
    from collector.tools.importers.sink import SinkError
    from collector.tools.simulate import Hang, SimulateError, Simulation, SlowLink, Straggler, stream, write_data_dir

    try:
        if args.streams < 1:
            raise SimulateError(f"--streams must be >= 1, got {args.streams}")
        sim = Simulation(
            ranks=args.ranks,
            steps=args.steps,
            collectives_per_step=args.collectives_per_step,
            hosts=args.hosts,
            stragglers=tuple(Straggler.parse(s) for s in args.straggler),
            hang=Hang.parse(args.hang) if args.hang is not None else None,
            slow_links=tuple(SlowLink.parse(x) for x in args.slow_link),
            host_groups=args.host_groups,
            world_only=args.world_only,
            telemetry_apart=args.telemetry_apart,
            name=args.name,
            seed=args.seed,
        )
        if sim.hang is not None:
            sim = sim.anchored_now()
    except SimulateError as exc:
        print(f"rankscope simulate: {exc}", file=sys.stderr)
        return 2
    total = sim.records_per_rank * sim.ranks
    began = time.monotonic()
    where = args.endpoint or args.data_dir
    hang = f", rank {sim.hang.rank} hung at step {sim.hang.step}" if sim.hang else ""
    print(
        f"simulating {sim.run_id}: {sim.ranks} ranks x {sim.steps} steps{hang}, {total:,} records -> {where}",
        flush=True,
    )
    last = [began]

    def progress(done_ranks: int, _records, note: str = "") -> None:
        now = time.monotonic()
        if note:
            print(f"  {note} ({now - began:.1f} s)", flush=True)
        elif now - last[0] >= 2 or done_ranks == sim.ranks:
            last[0] = now
            print(f"  {done_ranks}/{sim.ranks} ranks ({now - began:.1f} s)", flush=True)

    try:
        if args.endpoint:
            stream(sim, args.endpoint, token=args.token, streams=args.streams, progress=progress)
        else:
            write_data_dir(sim, args.data_dir, progress=progress)
    except (SinkError, SimulateError, OSError) as exc:
        print(f"rankscope simulate: {exc}", file=sys.stderr)
        return 1
    took = time.monotonic() - began
    print(f"done: run {sim.run_id} ({sim.name}), {total:,} records in {took:.1f} s ({total / took:,.0f}/s)")
    return 0
