"""Fake runs: a synthetic multi-rank run whose story is known in advance, so a test can
check that the collector, the catalog, the dashboard or a tool finds it.

The story (``FakeRun``'s defaults): 4 ranks on two hosts train 50 steps; every step
issues the ``COLLECTIVES`` pattern (all_reduces of five sizes on "world", a
reduce_scatter and two all_gathers on "zero"); rank ``late_rank`` (the last, 3) enters every
all_reduce ``delay_ns`` (40 ms) late, so it is the last to arrive at all of them and the
others wait for it; the fp16 loss scale halves at ``overflow_steps``; the experts of
both MoE layers are unevenly loaded (expert 0 the busiest, some tokens dropped); every
rank has the flops tree ``FLOPS_TREE``, the late rank's 1.3x slower. Each table the
collector stores gets rows: comm, timers, monitor, loss_scale, memory, moe, flops.

Two ways out, the same rows either way:

- ``write_data_dir(data_dir, *runs)``: Parquet files in the collector's layout
  (``D/parquet/<table>/run=<id>/``, the stored schemas, one runs/ranks row per Hello,
  rank_ends once a rank has ended) and the catalog over them -- what the dashboard's
  tests and benchmark read. File names are ``fake-...``: a collector later opened on
  the dir treats them as someone else's segments and leaves them alone.
- ``rank_envelopes(run, rank)`` / ``stream(endpoint, *runs)``: what each rank would
  send (Hello, TableBatches, RunEnd), through a real collector.

Every value is a function of (seed, rank, instance or step), never of how the run is
cut into chunks: ``run.comm_columns(rank, 0, 100)`` is ``comm_columns(rank, 0, 50)``
followed by ``comm_columns(rank, 50, 50)``, and a rank's rows do not depend on which
other ranks are generated. Collectives of one instance finish together on every rank,
after the story's last arrival (the late rank's delay plus the largest jitter).

For tests of the wire protocol, ``comm_columns`` / ``comm_envelope`` give one rank's
share of ``uniform_run``: 1 KiB all_reduces, ten to a step, with no jitter, so
``delay_ns`` is exactly the late rank's arrival delay; ``hello`` and ``run_end`` make
the other two envelope kinds.
"""

from collector.data.codec import encode_batch
from collector.testing.fake_runs.data_dir import _write, write_data_dir, write_run
from collector.testing.fake_runs.envelopes import (
    StoreFeed,
    comm_columns,
    comm_envelope,
    envelopes_of,
    hello,
    rank_envelopes,
    run_end,
    stream,
)
from collector.testing.fake_runs.story import (
    BAD_PARAM,
    COLLECTIVES,
    FINISHED,
    FLOPS_TREE,
    HOSTS,
    LIVE,
    MEMORY,
    MOE_CAPACITY,
    MOE_EXPERTS,
    MOE_LAYERS,
    MOE_TOKENS,
    OVERFLOW_FIRST_RANK,
    PIPE_FWD_NS,
    PIPE_MICRO_BATCHES,
    PROFILE_STEP,
    SAMPLES_PER_RANK_STEP,
    START,
    STORY_TABLES,
    TIMERS,
    TOKENS_PER_SAMPLE,
    FakeRun,
    FakeRunError,
    _stored,
    uniform_run,
)
from collector.tools.importers.sink import envelope, table_batches

__all__ = [
    "BAD_PARAM",
    "COLLECTIVES",
    "FINISHED",
    "FLOPS_TREE",
    "HOSTS",
    "LIVE",
    "MEMORY",
    "MOE_CAPACITY",
    "MOE_EXPERTS",
    "MOE_LAYERS",
    "MOE_TOKENS",
    "OVERFLOW_FIRST_RANK",
    "PIPE_FWD_NS",
    "PIPE_MICRO_BATCHES",
    "PROFILE_STEP",
    "SAMPLES_PER_RANK_STEP",
    "START",
    "STORY_TABLES",
    "TIMERS",
    "TOKENS_PER_SAMPLE",
    "FakeRun",
    "FakeRunError",
    "StoreFeed",
    "_stored",
    "_write",
    "comm_columns",
    "comm_envelope",
    "encode_batch",
    "envelope",
    "envelopes_of",
    "hello",
    "rank_envelopes",
    "run_end",
    "stream",
    "table_batches",
    "uniform_run",
    "write_data_dir",
    "write_run",
]
