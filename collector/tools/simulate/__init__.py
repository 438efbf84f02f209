"""``rankscope simulate``: a synthetic run of thousands of ranks, to try the dashboard at
scale and to load-test a collector.

Every rank repeats a real engine step (collector/tools/simulate_template.py: the ZeRO-2 sample run's
collectives, timers, monitor tags and memory kinds), on a "world" group of all ranks, with a few
hundred microseconds of per-rank jitter. ``--straggler RANK:MS[@STEP]`` makes one rank's forward
pass MS slower from STEP on, so it enters the step's first collective MS late and everyone else
waits for it there; the rest of the step runs MS later on every rank -- the story ``rankscope
health`` and the Stragglers page must tell. ``--hang RANK:STEP`` makes RANK stop before the first
collective of STEP (a stall in Python, say a data loader that never returns) while every other rank
enters it and waits: the run is a snapshot ``hang_after_s`` + ``HANG_SEEN_S`` into the hang, with
what real ranks send while hung (collector.rank.watchdog): a heartbeat a second from every rank, the
waiting ranks' ``inflight`` reports, their stacks captured at ``hang_after_s``, the stuck rank's
stack as the collector's request for it gets answered, and no RunEnd. Its clock is anchored so that
the snapshot is *now*: the hang is current when it is written, as ``rankscope health`` and the
Liveness page judge it; a while later the frozen heartbeats read as silent ranks too, which is what
a job frozen since looks like. (Streamed, the ranks' streams close without RunEnd, so the collector
also reports them stopped, as for a hung job killed.)

``--slow-link HOST:FACTOR@STEP[-END]`` (implies ``--host-groups``) makes HOST's link FACTOR times
slower in steps STEP to END-1 (END: when it is restored; without, to the end). ``--host-groups``
adds, after the template's collectives, what a run over several hosts also does each step: a 4 MiB
all_reduce inside each host (group ``host<h>``) and one with the same local rank on each
neighbouring host (``pair<h>.<l>``: hosts h and h+1, a ring over the hosts; as pipeline stages
exchange). A slow link stretches the transfer of the pairs through it and of the collectives over
every host (a ring is as fast as its slowest link), not those inside hosts: the story
``rankscope health`` must localise to that host (collector/data/findings/links.py). The transfers
it stretches lengthen the step by as much (collector/tools/simulate/slow_steps.py).
``--world-only``: the world is the run's only group, as in plain DDP/FSDP, and a slow link adds no
host groups; what tells the host then is its telemetry, whose flushes queue behind its slow link
and reach the collector unevenly (collector/tools/simulate/telemetry.py: the ``deliveries`` rows a
collector keeps, written with every run into a data dir; ``--telemetry-apart``: over another
network, which no slow link delays).

Values are a pure function of (seed, rank, step), generated for a block of ranks at a time
with numpy, so memory stays bounded (one block) at any size and the same arguments give the
same run whichever way it is delivered:

- ``--data-dir D``: straight into D through the collector's own Store (collector/server/store.py:
  the same ledger, segment names and Parquet settings as a running collector; one block of
  ranks is one submission), then the catalog. Fails clearly if a collector holds D.
- ``--endpoint E``: through a live collector, one gRPC stream per rank as real ranks send
  them, multiplexed over one channel from this process (collector/tools/importers/sink.py),
  at most ``--streams`` streams open at a time; returns once every record is durable.

The package: ``faults`` (what --straggler, --hang and --slow-link say), ``simulation`` (a run's
shape and every table's rows, a block of ranks at a time), ``slow_steps`` (a slow link's factor
and the step it stretches), ``host_groups``, ``hang`` and ``telemetry`` (the rows those add),
``rows`` (noise, stored tables), ``deliver`` (into a data dir or a collector). The
command's flags are collector/tools/commands/simulate.py.
"""

from collector.tools.simulate.deliver import stream, write_data_dir
from collector.tools.simulate.faults import Hang, SimulateError, SlowLink, Straggler
from collector.tools.simulate.host_groups import HOST_GROUP_BYTES, PAIR_TRANSFER_NS
from collector.tools.simulate.rows import JITTER_NS, hash_uniform
from collector.tools.simulate.simulation import Simulation

__all__ = [
    "HOST_GROUP_BYTES",
    "JITTER_NS",
    "PAIR_TRANSFER_NS",
    "Hang",
    "SimulateError",
    "Simulation",
    "SlowLink",
    "Straggler",
    "hash_uniform",
    "stream",
    "write_data_dir",
]
