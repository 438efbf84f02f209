"""The dashboard's cached view of the query layer (collector.data.queries).

Every SQL statement lives in collector.data.queries; this module only caches its
results for Streamlit. Page queries are keyed by the run's *data version* (a
fingerprint of its committed segments, which never change once renamed into
place), so a finished run stays cached while a live one refreshes exactly when
new segments land; the TTL only bounds memory.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import threading
from collections import OrderedDict
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import streamlit as st

from collector.data import calibration as calibrations
from collector.data import layout, pipeline, whatif
from collector.data import queries as q
from collector.data.findings import links
from collector.data.queries import CommFilter, DataDirError, data_version, training_filter

CACHE_TTL_S = 600
CACHE_ENTRIES = 256
_FILTERED = {"hash_funcs": {CommFilter: CommFilter.key}}
LIVE_TIMEOUT_S = 1.0  # the banner asks the live collector again at its next re-check; the data dir answers meanwhile

__all__ = ["CommFilter", "DataDirError", "data_version", "training_filter"]


@st.cache_resource(show_spinner=False)
def catalog(data_dir: str) -> q.Catalog:
    return q.Catalog(data_dir)


def _release_catalogs() -> None:
    """At interpreter exit, drop the cached catalogs: each one's DuckDB connection then goes while
    DuckDB is whole. Streamlit's resource cache outlives the interpreter's teardown otherwise (seen
    with the app run by AppTest in a process that had imported torch: a test worker), and a
    DuckDBPyConnection alive then makes DuckDB's
    bindings (nanobind) print "leaked 29 instances" (the connection, DuckDB's type objects) after the
    process's last line. Dropped, not closed: a session thread still inside a query holds its own
    reference and cursor, and closing a connection under a running query aborts the process."""
    try:
        catalog.clear()
    except Exception:  # a cache Streamlit already tore down: nothing left to drop, and no traceback at exit
        pass


atexit.register(_release_catalogs)


def _cached(**kw):
    return st.cache_data(ttl=CACHE_TTL_S, max_entries=CACHE_ENTRIES, show_spinner=False, **kw)


def _page_query(name: str, query, **kw):
    """``query`` cached as ``name``: Streamlit keys a cache by the function's qualified name and
    source, which the wrappers below share."""
    query.__name__ = query.__qualname__ = name
    return _cached(**kw)(query)


def _per_run(name: str):
    """``collector.data.queries.<name>(catalog, run_id)`` as a cached page query
    ``(data_dir, run_id, version)``."""

    def query(data_dir: str, run_id: str, version: str):
        return getattr(q, name)(catalog(data_dir), run_id)

    return _page_query(name, query)


def _filtered(name: str):
    """``collector.data.queries.<name>(rollup, flt)`` over the run's comm rollup as a cached page
    query ``(data_dir, run_id, version, flt)``."""

    def query(data_dir: str, run_id: str, version: str, flt: CommFilter):
        return getattr(q, name)(comm_rollup(data_dir, run_id, version), flt)

    return _page_query(name, query, **_FILTERED)


# --- runs --------------------------------------------------------------------


@st.cache_data(ttl=1, show_spinner=False)
def list_runs(data_dir: str) -> pd.DataFrame:
    """Cached for a second only: it tells the pages whether a run is still live."""
    return q.list_runs(catalog(data_dir))


def table_version(data_dir: str, run_id: str, tables: tuple[str, ...]) -> str:
    """Fingerprint of ``run_id``'s committed segments of ``tables`` only (a directory listing):
    a chart over the monitor table need not be redrawn because comm records landed."""
    digest = hashlib.sha1()
    root = Path(data_dir)
    for table in tables:
        part = layout.partition_dir(root, table, run_id)
        try:
            entries = sorted(os.scandir(part), key=lambda e: e.name)
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            if entry.name.endswith(layout.SEGMENT_SUFFIX) and not entry.name.startswith("."):
                st_ = entry.stat()
                digest.update(f"{table}/{entry.name}:{st_.st_size}:{st_.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


latest_step = _per_run("latest_step")
ranks = _per_run("ranks")


# --- the comm rollup and what reads it ------------------------------------------


@st.cache_resource(ttl=CACHE_TTL_S, max_entries=16, show_spinner="Building per-step rollups…")
def comm_rollup(data_dir: str, run_id: str, version: str) -> pa.Table:
    return _ROLLUPS.rollup(data_dir, run_id)


class _Rollups:
    """A live run's comm rollup, grown by its new steps: the steps every rank has moved past
    (less a margin) are kept ("frozen") and only the later ones are rolled up again at the
    next data version (``q.comm_rollup_after``), so a refresh costs the new steps, not the run.
    A run whose registered ranks have not all sent comm records yet is rolled up whole."""

    MARGIN_STEPS = 2  # steps short of every rank's latest that are taken as complete
    RUNS = 8  # runs whose frozen part is kept

    def __init__(self) -> None:
        self._frozen: OrderedDict[tuple[str, str], tuple[pa.Table, int]] = OrderedDict()
        self._lock = threading.Lock()

    def rollup(self, data_dir: str, run_id: str) -> pa.Table:
        cat = catalog(data_dir)
        with self._lock:
            held = self._frozen.get((data_dir, run_id))
        if held is None:
            table = q.comm_rollup(cat, run_id)
        else:
            frozen, through = held
            fresh = q.comm_rollup_after(cat, run_id, through)
            table = pa.concat_tables([frozen, fresh.cast(frozen.schema)])
        self._freeze(cat, data_dir, run_id, table, held[1] if held else None)
        return table

    def _freeze(self, cat, data_dir: str, run_id: str, table: pa.Table, through: int | None) -> None:
        if table.num_rows == 0:
            return
        latest = table.group_by("rank").aggregate([("step", "max")])
        complete = pc.min(latest["step_max"]).as_py() - self.MARGIN_STEPS
        if through is not None and complete <= through:
            return
        if latest.num_rows < len(q.ranks(cat, run_id)):
            return  # a rank that has not reported yet may still send early steps
        frozen = table.filter(pc.less_equal(table["step"], complete))
        with self._lock:
            self._frozen[(data_dir, run_id)] = (frozen, complete)
            self._frozen.move_to_end((data_dir, run_id))
            while len(self._frozen) > self.RUNS:
                self._frozen.popitem(last=False)


_ROLLUPS = _Rollups()


@_cached()
def comm_dimensions(data_dir: str, run_id: str, version: str) -> dict:
    return q.comm_dimensions(comm_rollup(data_dir, run_id, version))


log_summary = _filtered("log_summary")
bandwidth_by_step = _filtered("bandwidth_by_step")
bandwidth_by_size = _filtered("bandwidth_by_size")


@_cached()
def link_frames(data_dir: str, run_id: str, version: str) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """What findings.links reads: per-group transfer times, group members, each rank's host."""
    rollup = comm_rollup(data_dir, run_id, version)
    return q.link_transfers(rollup), q.group_members(rollup), ranks(data_dir, run_id, version)


deliveries = _per_run("deliveries")


@_cached()
def calibration(data_dir: str, run_id: str, version: str) -> pd.DataFrame | None:
    """The stored `rankscope calibrate` sweep of exactly the run's hosts, or None."""
    return calibrations.load(data_dir, ranks(data_dir, run_id, version).host.dropna().unique())


def link_evidence(data_dir: str, run_id: str, version: str) -> dict:
    """What findings.links reads besides the comm rollup: which host's telemetry queued, and what a
    transfer should cost on these hosts (the same inputs `rankscope health` gives it)."""
    return {
        "deliveries": deliveries(data_dir, run_id, version),
        "calibration": calibration(data_dir, run_id, version),
    }


@_cached()
def busbw_envelope(data_dir: str, run_id: str, version: str) -> tuple[pd.DataFrame, pd.DataFrame, list]:
    """(band, marks, slow_link findings) of the run: the expected busbw per op and size and the
    sizes a slow link pushed under it (collector.data.findings.links)."""
    found = links.slow_links(
        *link_frames(data_dir, run_id, version),
        step_analysis(data_dir, run_id, version),
        **link_evidence(data_dir, run_id, version),
    )
    band, marks = links.busbw_envelope(q.busbw_by_step_size(comm_rollup(data_dir, run_id, version)), found)
    return band, marks, found


@_cached()
def link_health(data_dir: str, run_id: str, version: str) -> pd.DataFrame:
    """Hosts x steps of cross-host transfer over expected, cut for a chart (findings.links)."""
    ratios = links.transfer_ratios(*link_frames(data_dir, run_id, version))
    return links.link_health_grid(links.host_link_ratios(ratios))


comm_by_rank = _filtered("comm_by_rank")
delay_heatmap = _filtered("delay_heatmap")


@_cached(**_FILTERED)
def binned_delay(
    data_dir: str, run_id: str, version: str, flt: CommFilter, bins: pd.DataFrame, value: str
) -> pd.DataFrame:
    return q.binned_delay(comm_rollup(data_dir, run_id, version), flt, bins, value)


last_arrivals = _filtered("last_arrivals")


@_cached()
def instances_at(data_dir: str, run_id: str, version: str, step: int, rank: int) -> pd.DataFrame:
    return q.instances_at(catalog(data_dir), run_id, step, rank)


retention = _per_run("retention")


@_cached()
def raw_steps_near(data_dir: str, run_id: str, version: str, step: int) -> list[int]:
    return q.raw_steps_near(catalog(data_dir), run_id, step)


# --- per-step tables -----------------------------------------------------------


step_breakdown = _per_run("step_breakdown")
step_wall_ms = _per_run("step_wall_ms")
step_analysis = _per_run("step_analysis")
signals_by_step = _per_run("signals_by_step")
monitor_series = _per_run("monitor_series")
loss_scale = _per_run("loss_scale")
flops_profile = _per_run("flops_profile")


@_cached()
def memory_lines(data_dir: str, run_id: str, version: str, k: int) -> pd.DataFrame:
    return q.memory_lines(catalog(data_dir), run_id, k)


loss_series = _per_run("loss_series")
memory_trend = _per_run("memory_trend")
clock_skew = _per_run("clock_skew")
moe_load = _per_run("moe_load")


@_cached()
def pipe_bubbles(data_dir: str, run_id: str, version: str) -> pd.DataFrame:
    return pipeline.stage_bubbles(catalog(data_dir), run_id)


@_cached()
def pipe_timeline(data_dir: str, run_id: str, step: int, data_rank: int, version: str) -> pd.DataFrame:
    return pipeline.timeline(catalog(data_dir), run_id, step, data_rank)


@_cached()
def whatif_result(data_dir: str, run_id: str, version: str) -> dict | None:
    """The run's what-if replay (collector.data.whatif), or None where it has no ops the replay models."""
    return whatif.replay_or_none(catalog(data_dir), run_id)


@st.cache_data(ttl=5, show_spinner=False)
def runs_with(data_dir: str, table: str) -> set[str]:
    return q.runs_with(data_dir, table)


def console_query(data_dir: str, sql: str, max_rows: int) -> pd.DataFrame:
    """User SQL through the read-only guard; raises catalog.QueryError."""
    return q.console_query(data_dir, sql, max_rows)


@st.cache_data(ttl=60, show_spinner=False)
def console_views(data_dir: str) -> list[str]:
    """The views the SQL console can read, from the catalog itself (internal ``_...`` ones left out)."""
    names = q.console_query(data_dir, "SHOW TABLES", 10_000).iloc[:, 0].astype(str)
    return sorted(n for n in names if not n.startswith("_"))


# --- liveness: a second's cache, since silence grows with time even when no data lands ------


@st.cache_data(ttl=1, max_entries=CACHE_ENTRIES, show_spinner=False)
def live_attention(data_dir: str, run_id: str) -> list[str] | None:
    """What needs attention now in the run, as the live collector serving the data dir holds it
    (collector.data.live_collector.fetch: what `rankscope health`, /metrics and the alerts say, stuck
    judged within a quarter of a second): the sentences of its warnings and critical findings of the
    banner's kinds, most urgent first; None when no collector follows the run live."""
    from collector.data.findings import ATTENTION_KINDS
    from collector.data.live_collector import fetch

    answer = fetch(data_dir, run_id, timeout_s=LIVE_TIMEOUT_S)
    if answer is None:
        return None
    return [
        f["text"] for f in answer.findings if f["kind"] in ATTENTION_KINDS and f["severity"] in ("critical", "warning")
    ]


@st.cache_data(ttl=1, max_entries=CACHE_ENTRIES, show_spinner=False)
def liveness_findings(data_dir: str, run_id: str, version: str) -> list:
    """The run's hang, collective-mismatch and silent-rank findings (critical, current)."""
    from collector.data.findings import liveness_findings as judge

    return judge(
        hangs(data_dir, run_id, version), desyncs(data_dir, run_id, version), rank_liveness(data_dir, run_id, version)
    )


@st.cache_data(ttl=1, max_entries=CACHE_ENTRIES, show_spinner=False)
def hangs(data_dir: str, run_id: str, version: str) -> pd.DataFrame:
    return q.hangs(catalog(data_dir), run_id)


@st.cache_data(ttl=1, max_entries=CACHE_ENTRIES, show_spinner=False)
def rank_liveness(data_dir: str, run_id: str, version: str) -> pd.DataFrame:
    return q.rank_liveness(catalog(data_dir), run_id)


wavefront = _per_run("wavefront")
stacks = _per_run("stacks")
desyncs = _per_run("desyncs")


# --- evidence (collector.data.trace_diff) ---------------------------------------------


@_cached()
def evidence(data_dir: str, run_id: str, version: str) -> list[dict]:
    """The run's captured profiles diffed, newest first; ``version``: the artifacts table's."""
    from collector.data import trace_diff

    return trace_diff.run_evidence(catalog(data_dir), data_dir, run_id)


@_cached()
def merged_trace(data_dir: str, traces: tuple[tuple[int, str, str], ...]) -> bytes:
    """(rank, role, path under the data dir) each -> one Perfetto/Chrome JSON, side by side."""
    import json

    from collector.data import trace_diff

    loaded = [(rank, role, trace_diff.load(Path(data_dir) / path)) for rank, role, path in traces]
    return json.dumps(trace_diff.merged(loaded)).encode()
