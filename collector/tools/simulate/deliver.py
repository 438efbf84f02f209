"""Where a simulated run goes: straight into a data dir through the collector's own Store, or
through a live collector, one gRPC stream per rank."""

from __future__ import annotations

import numpy as np

from collector.data import catalog
from collector.data.codec import envelope_rows
from collector.tools.importers.sink import GrpcSink, envelope
from collector.tools.simulate.faults import SimulateError
from collector.tools.simulate.simulation import Simulation
from collector.tools.simulate.telemetry import delivery_rows


def write_data_dir(sim: Simulation, data_dir, progress=None, *, rollups: bool = True) -> int:
    """Write ``sim`` into ``data_dir`` through the collector's Store; returns the records written.
    ``rollups``: then store what a collector's compaction would have by the end (per-step rollups
    and step analysis of the settled steps, small segments merged), as a recorded run has them."""
    # the server side: only this delivery needs it
    from collector.server.compaction import Compactor
    from collector.server.store import Store

    catalog.ensure_catalog(data_dir)
    store = Store(data_dir)
    errors: list[BaseException] = []
    written = 0
    try:
        for ranks, tables in sim.blocks():
            rows = []
            for r in ranks:
                rows += envelope_rows(envelope(sim.client_id(r), 1, hello=sim.hello(r)))
                if sim.hang is None:
                    rows += envelope_rows(envelope(sim.client_id(r), 2, end=sim.run_end(r)))
            rows += [(table, sim.run_id, t) for table, t in tables.items()]
            # the collector's own record of when each flush arrived (a slow link's side)
            rows.append(("deliveries", sim.run_id, delivery_rows(sim, np.arange(ranks.start, ranks.stop), sim.steps)))
            store.submit(f"simulate-{sim.run_id}-block{ranks.start}", 1, rows, lambda e: e and errors.append(e))
            written += sum(t.num_rows for t in tables.values())
            if progress:
                progress(ranks.stop, written)
        store.flush()
        if rollups:
            if progress:
                progress(sim.ranks, written, note="storing per-step rollups and step analysis, as a collector does")
            Compactor(data_dir, store.ledger).catch_up()
    finally:
        store.close()
    if errors:
        raise SimulateError(f"writing {data_dir} failed: {errors[0]}")
    catalog.ensure_catalog(data_dir)
    return written


def stream(sim: Simulation, endpoint: str, *, token: str | None = None, streams: int = 128, progress=None) -> int:
    """Send ``sim`` through the collector at ``endpoint``: one stream per rank, ``streams`` at a
    time over one channel; returns the envelopes acknowledged (durable)."""
    acked = 0
    with GrpcSink(endpoint, token=token) as sink:
        for first in range(0, sim.ranks, streams):
            wave = range(first, min(sim.ranks, first + streams))
            acked += sink.send(sim.rank_envelopes(r) for r in wave)
            if progress:
                progress(wave.stop, None)
    return acked
