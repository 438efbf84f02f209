"""Many runs (issue 28, item 9) on a Store and compaction in process: new rows after a fold land beside
it, a restarted store knows the folded runs, rollups and archives read the shared rows, /metrics
exports at most max runs, and liveness forgets runs nothing can happen to.

Split by tier: what needs processes, sockets or seconds is in tests/integration/server/test_many_runs.py."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from collector.data import catalog, layout
from collector.data.codec import envelope_rows
from collector.server.compaction import CompactionConfig, Compactor
from collector.server.store import Store, StoreConfig
from collector.testing import fake_runs

RUNS = 1000


def _files(data: Path, table: str) -> list[Path]:
    return [
        p
        for p in (data / layout.PARQUET_DIR / table).rglob(f"*{layout.SEGMENT_SUFFIX}")
        if p.parent.name != layout.PLACEHOLDER_PARTITION
    ]


def _hello_only_runs(data: Path, n: int = RUNS, ended_every: int | None = 2) -> Store:
    """``n`` one-rank runs, each a Hello; every ``ended_every``-th also a RunEnd (one commit)."""
    store = Store(data, StoreConfig(flush_interval=0.05))
    for i in range(n):
        client = f"c{i}"
        rows = envelope_rows(fake_runs.hello(client, 1, f"many-{i:04d}", 0, 1))
        store.submit(client, 1, rows, lambda error: None)
        if ended_every and i % ended_every == 0:
            store.submit(client, 2, envelope_rows(fake_runs.run_end(client, 2, f"many-{i:04d}", 0)), lambda e: None)
    store.flush()
    return store


def _count(con, sql: str) -> int:
    return con.execute(sql).fetchone()[0]


def test_new_rows_after_a_fold_land_beside_it_and_the_next_fold_takes_them(tmp_path):
    """A run's folder comes back for its RunEnd after its Hello was folded (the store makes it again),
    and the shared partition itself is merged like any other, so its files stay few."""
    store = _hello_only_runs(tmp_path, n=50, ended_every=None)
    try:
        compactor = Compactor(tmp_path, store.ledger, CompactionConfig(min_files=4))
        for round_ in range(10):
            i = round_
            store.submit(f"c{i}", 2, envelope_rows(fake_runs.run_end(f"c{i}", 2, f"many-{i:04d}", 0)), lambda e: None)
            store.flush()
            compactor.run_once()
        assert len(_files(tmp_path, "rank_ends")) < 4
        con = catalog.connect(tmp_path)
        try:
            assert _count(con, "SELECT count(*) FROM runs WHERE status = 'finished'") == 10
        finally:
            con.close()
    finally:
        store.close()


def test_a_restarted_store_knows_the_folded_runs(tmp_path):
    """The first Hello of a run writes its runs row; a later Hello of the same run (after a restart)
    does not write another, whether the first is in the run's folder or folded."""
    store = _hello_only_runs(tmp_path, n=20)
    Compactor(tmp_path, store.ledger, CompactionConfig()).run_once()
    store.close()
    store = Store(tmp_path, StoreConfig(flush_interval=0.05))
    try:
        store.submit("again", 1, envelope_rows(fake_runs.hello("again", 1, "many-0003", 1, 2)), lambda e: None)
        store.flush()
        rows = sum(pq.read_metadata(f).num_rows for f in _files(tmp_path, "runs"))
        assert rows == 20
        assert len(_files(tmp_path, "ranks")) == 2  # the shared file and the new Hello's
    finally:
        store.close()


def test_rollups_find_the_world_size_and_the_ends_of_a_run_whose_hello_was_folded(tmp_path):
    run = fake_runs.FakeRun(run_id="folded", world_size=2, steps=12, collectives_per_step=2)
    store = Store(tmp_path)
    feed = fake_runs.StoreFeed(store, run)
    try:
        for rank in range(run.world_size):
            feed.hello(rank)
        store.flush()
        compactor = Compactor(tmp_path, store.ledger, CompactionConfig(retention_window=100))
        compactor.run_once()  # the Hellos are folded; no comm rows yet
        assert not layout.partition_dir(tmp_path, "runs", run.run_id).exists()
        (chunk,) = run.comm_chunks(run.steps)
        for rank in range(run.world_size):
            feed.comm(rank, chunk)
            feed.end(rank)
        store.flush()
        compactor.run_once()  # rank_ends still in the run's folder: read there
        assert compactor.retention._rolled_through(run.run_id) == run.steps - 1
    finally:
        store.close()


def test_an_archive_of_a_folded_run_carries_its_runs_and_ranks_rows(tmp_path):
    from collector.tools.export import export_archive, unpack_archive

    store = _hello_only_runs(tmp_path / "data", n=30)
    Compactor(tmp_path / "data", store.ledger, CompactionConfig()).run_once()
    store.close()
    export_archive(tmp_path / "data", "many-0004", tmp_path / "one.tar")
    unpack_archive(tmp_path / "one.tar", tmp_path / "unpacked")
    con = catalog.connect(tmp_path / "unpacked")
    try:
        assert con.execute("SELECT run_id, status, n_ranks FROM runs").fetchall() == [("many-0004", "finished", 1)]
        assert _count(con, "SELECT count(*) FROM ranks") == 1
    finally:
        con.close()


class _State:
    """What MetricsEndpoint reads of a collector: its data dir and which runs stream here."""

    def __init__(self, data_dir: Path, streaming: set[str]) -> None:
        self.data_dir, self.streaming = data_dir, streaming
        self.liveness = self

    def streaming_runs(self) -> set[str]:
        return set(self.streaming)


def test_metrics_export_at_most_max_runs_streaming_first_and_compute_only_what_changed(tmp_path, monkeypatch):
    from collector.server import metrics as metrics_module

    monkeypatch.setattr(metrics_module.MetricsEndpoint, "_run", lambda self: None)  # refresh by hand only
    store = _hello_only_runs(tmp_path, n=10, ended_every=None)  # 10 runs, all still running
    computed: list[str] = []
    real = metrics_module.MetricsEndpoint._refresh_run

    def counting(self, run):
        computed.append(run.run_id)
        return real(self, run)

    monkeypatch.setattr(metrics_module.MetricsEndpoint, "_refresh_run", counting)
    endpoint = metrics_module.MetricsEndpoint(_State(tmp_path, {"many-0000"}), None, max_runs=3)
    try:
        first = endpoint.refresh()
        exported = {labels[0] for labels, _ in first.gauges["rankscope_ranks_omitted"]}
        assert len(exported) == 3 and "many-0000" in exported  # the run streaming here, then the newest
        assert endpoint.runs_omitted == 7
        assert sorted(computed) == sorted(exported)

        endpoint.state.streaming = set()  # its stream closed: the three newest now
        endpoint.refresh()
        exported = {"many-0007", "many-0008", "many-0009"}
        assert computed[-1] == "many-0007"  # the one new to the list; the others stand

        computed.clear()
        second = endpoint.refresh()  # nothing changed and nothing streams here: nothing computed again
        assert computed == [] and second.gauges == endpoint.refresh().gauges
        assert {labels[0] for labels, _ in second.gauges["rankscope_ranks_omitted"]} == exported

        again = sorted(exported)[0]  # a rank of it says Hello again: its data changed
        store.submit("again", 1, envelope_rows(fake_runs.hello("again", 1, again, 0, 1)), lambda e: None)
        store.flush()
        endpoint.refresh()
        assert computed == [again]
    finally:
        endpoint.close()
        store.close()


def test_liveness_forgets_runs_that_nothing_can_happen_to_without_new_data():
    from collector.server.liveness import Liveness

    class Store:
        def submit(self, *args):
            pass

    class Stream:
        def request(self, request):
            pass

    liveness = Liveness(Store(), start=False)
    streams = [Stream() for _ in range(100)]
    for i, stream in enumerate(streams):
        liveness.observe(stream, fake_runs.hello(f"c{i}", 1, f"run-{i}", 0, 1))
    for stream in streams[1:]:
        liveness.closed(stream)
    liveness.check()
    assert list(liveness.runs) == ["run-0"]  # only the run still streaming is walked
    assert liveness.streaming_runs() == {"run-0"}
    liveness.closed(streams[0])
    liveness.check()
    assert liveness.runs == {}
