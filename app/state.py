"""What every page shares: the data dir, the selected run(s), and live refresh.

The run selection lives in ``st.session_state`` (the sidebar picker declared by
main.py, which runs before every page) and is mirrored into the ``?run=`` query
parameter so a URL reopens the same runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import duckdb
import pandas as pd
import streamlit as st

from app import queries
from collector.data import retention
from collector.data.queries.runs import AmbiguousRun, UnknownRun, pick_run

DEFAULT_DATA_DIR = "rankscope-data"
REFRESH_S = 1.0  # how often a live page's sections look for new data (each its own fragment)
STATUS_EVERY_S = 5.0  # a live run's status is re-read at most this often unless its data moved
LIVENESS_REFRESH_S = 2.0  # the attention banner's re-check (hangs and silence grow with time alone)
# what reads the whole run (findings, the what-if replay, the busbw envelope) follows a live run at most
# this often: rebuilt at every 1 s refresh, they took most of a loaded server's CPU
SUMMARY_EVERY_S = 5.0
MEMO_KEY, MEMO_ENTRIES = "rankscope.memo", 64
STATUS_KEY = "rankscope.live_status"
T = TypeVar("T")
MAX_COMPARED = 2
SELECTION_KEY = "selected_runs"
AMBIGUOUS_KEY = "rankscope.ambiguous_run"  # (name, its run ids) while ?run= names several runs


def data_dir() -> str:
    """``streamlit run app/main.py -- --data-dir D``, else $RANKSCOPE_DATA_DIR, else the CLI default."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--data-dir")
    args, _ = parser.parse_known_args(sys.argv[1:])
    return os.path.abspath(args.data_dir or os.environ.get("RANKSCOPE_DATA_DIR") or DEFAULT_DATA_DIR)


@dataclass(frozen=True)
class Selection:
    data_dir: str
    runs: pd.DataFrame  # every run, newest first
    run_ids: tuple[str, ...]  # the selected ones, primary first

    @property
    def run_id(self) -> str:
        return self.run_ids[0]

    def run(self, run_id: str | None = None) -> pd.Series:
        return self.runs.set_index("run_id").loc[run_id or self.run_id]

    def is_live(self, run_id: str | None = None) -> bool:
        return self.run(run_id)["status"] == "running"


EMPTY_RUN_COLUMNS = ["run_id", "name", "status", "world_size", "n_ranks", "started_at", "ended_at", "duration_s"]


def load_runs(directory: str) -> pd.DataFrame | None:
    """The runs table, or None after showing why it cannot be read."""
    if not os.path.isdir(directory):
        st.error(
            f"Data dir `{directory}` does not exist. Start a collector with "
            f"`rankscope collect --data-dir {directory}` or pass `--data-dir` to the dashboard."
        )
        return None
    if not any(os.scandir(directory)):
        # A collector not started yet: no runs, and nothing is written here until one is.
        return pd.DataFrame(columns=EMPTY_RUN_COLUMNS)
    try:
        return queries.list_runs(directory)
    except (queries.DataDirError, OSError, duckdb.Error) as exc:
        st.error(f"Cannot read the runs in `{directory}`: {exc}")
    return None


def _label(runs: pd.DataFrame) -> Callable[[str], str]:
    names = dict(zip(runs.run_id, runs.name, strict=True))
    status = dict(zip(runs.run_id, runs.status, strict=True))
    return lambda run_id: f"{names.get(run_id) or run_id} ({run_id}, {status.get(run_id, '?')})"


def sidebar_picker() -> None:
    """Declared by main.py: the data dir and the run picker shared by all pages."""
    directory = data_dir()
    st.sidebar.caption(f"Data dir: `{directory}`")
    runs = load_runs(directory)
    st.session_state["rankscope.data_dir"] = directory
    st.session_state["rankscope.runs"] = runs
    if runs is None or runs.empty:
        return
    known = list(runs.run_id)
    if SELECTION_KEY not in st.session_state:
        wanted, st.session_state[AMBIGUOUS_KEY] = runs_in_url(runs, st.query_params.get_all("run"))
        st.session_state[SELECTION_KEY] = wanted[:MAX_COMPARED] or (
            [] if st.session_state[AMBIGUOUS_KEY] else known[:1]
        )
    ambiguous = st.session_state.get(AMBIGUOUS_KEY)
    if ambiguous:
        _pick_among(runs, *ambiguous)
    # Runs can disappear (a data dir swapped under us): keep only known ones.
    kept = [r for r in st.session_state[SELECTION_KEY] if r in known]
    st.session_state[SELECTION_KEY] = kept or ([] if st.session_state.get(AMBIGUOUS_KEY) else known[:1])
    chosen = st.sidebar.multiselect(
        "Runs (pick two to compare)", known, key=SELECTION_KEY, format_func=_label(runs), max_selections=MAX_COMPARED
    )
    st.query_params["run"] = chosen


def runs_in_url(runs: pd.DataFrame, asked: list[str]) -> tuple[list[str], tuple[str, list[str]] | None]:
    """The run ids ``?run=`` names, each an id or a name as the CLI takes it (queries.pick_run), and
    the first name that several runs share, with their ids, for a picker (None if there is none)."""
    rows = list(runs[["run_id", "name", "status", "started_at"]].itertuples(index=False, name=None))
    chosen, ambiguous = [], None
    for run in asked:
        try:
            run_id = pick_run(run, rows)
        except AmbiguousRun as exc:
            ambiguous = ambiguous or (run, exc.matches)
            continue
        except UnknownRun:
            continue
        if run_id not in chosen:
            chosen.append(run_id)
    return chosen, ambiguous


def _pick_among(runs: pd.DataFrame, name: str, matches: list[str]) -> None:
    """``?run=NAME`` that several runs share: ask which, instead of opening one of them silently."""
    pick = st.sidebar.radio(
        f"`?run={name}` names {len(matches)} runs: which one?",
        matches,
        index=None,
        format_func=_label(runs),
        key="rankscope.ambiguous_pick",
    )
    if pick is not None:
        st.session_state[AMBIGUOUS_KEY] = None
        st.session_state[SELECTION_KEY] = [pick, *st.session_state.get(SELECTION_KEY, [])][:MAX_COMPARED]


def select_runs(run_ids: list[str]) -> None:
    """Replace the shared selection (used by the Runs page's table)."""
    st.session_state[SELECTION_KEY] = list(run_ids)[:MAX_COMPARED]


def selection() -> Selection:
    """The page's data dir and runs; stops the page with a message when there is nothing to show."""
    directory = st.session_state.get("rankscope.data_dir") or data_dir()
    runs = st.session_state.get("rankscope.runs")
    if runs is None:
        st.stop()  # the sidebar already said why
    if runs.empty:
        st.info(
            f"No runs in `{directory}` yet. Stream one with `rankscope demo --data-dir {directory}`, "
            "attach `collector.hook` to a training script, or `rankscope import` DeepSpeed outputs."
        )
        st.stop()
    chosen = tuple(st.session_state.get(SELECTION_KEY) or ())
    if not chosen:
        st.info("Pick a run in the sidebar.")
        st.stop()
    return Selection(directory, runs, chosen)


def missing_data(sel: Selection, table: str, message: str) -> None:
    """Say that the selected run has no ``table`` rows, and offer the runs that do (one click
    switches the shared selection to that run)."""
    st.info(message)
    have = queries.runs_with(sel.data_dir, table)
    others = sel.runs[sel.runs.run_id.isin(have)]
    if others.empty:
        return
    st.caption("Runs that have it:")
    label = _label(sel.runs)
    for run_id in others.run_id:
        # A callback: it runs before the next script run creates the run picker, the only
        # moment Streamlit lets the picker's state change.
        st.button(label(run_id), key=f"switch-{table}-{run_id}", on_click=select_runs, args=([run_id],))


def retention_notice(data_dir: str, run_id: str, version: str) -> None:
    """Say which steps kept only their per-step rollup (``collect --raw-every``): a page over raw
    comm rows shows fewer of them there."""
    retained = queries.retention(data_dir, run_id, version)
    if retained:
        st.info(f"Retention: {retention.note(retained)}.")


def skipped_segments_notice() -> None:
    """Name the segments the catalog left out because they do not read: the page shows what is
    left of the run, and says what is missing."""
    directory = st.session_state.get("rankscope.data_dir") or data_dir()
    if not os.path.isdir(directory) or not any(os.scandir(directory)):
        return
    try:
        skipped = queries.catalog(directory).skipped
    except queries.DataDirError:
        return
    if skipped:
        st.warning(
            "Left out unreadable segment(s); the collector moves them to `quarantine/`: "
            + ", ".join(f"`{p}`" for p in sorted(skipped))
        )


def _guarded(body: Callable[[str], None], version: str) -> None:
    # A damaged or vanished segment is a message on the page, not a traceback.
    try:
        body(version)
    except duckdb.Error as exc:
        st.error(f"Could not read this run's data: {exc}")


def memo(key: str, version: str, build: Callable[[], T], *, at_most_every_s: float = 0.0) -> T:
    """``build()``, once per ``version`` of the data it reads, per browser session: a live page's
    figures and findings are rebuilt when their data moved, and sent again as they were when it did
    not (the browser redraws nothing for a chart whose figure is unchanged). ``key`` names the
    chart and whatever besides the data it depends on (run, filters, picks). With
    ``at_most_every_s``, a value younger than that is kept even though the data moved (an
    expensive summary in words need not follow every segment)."""
    store = st.session_state.setdefault(MEMO_KEY, {})
    held = store.get(key)
    now = time.monotonic()
    if held is not None and (held[0] == version or now - held[2] < at_most_every_s):
        return held[1]
    value = build()
    store.pop(key, None)
    store[key] = (version, value, now)
    while len(store) > MEMO_ENTRIES:
        store.pop(next(iter(store)))
    return value


def _still_live(data_dir: str, run_id: str, version: str) -> bool:
    """Whether the run is still running, read from the catalog when its data moved (a rank's end
    lands as a segment) or STATUS_EVERY_S passed, not at every refresh."""
    held = st.session_state.get(STATUS_KEY)
    now = time.monotonic()
    if held is not None and held[:2] == (run_id, version) and now - held[2] < STATUS_EVERY_S:
        return held[3]
    runs = queries.list_runs(data_dir)
    live = bool(runs.loc[runs.run_id == run_id, "status"].eq("running").any())
    st.session_state[STATUS_KEY] = (run_id, version, now, live)
    return live


def tables_version(sel: Selection, version: str, tables: tuple[str, ...], run_id: str | None = None) -> str:
    """The version of ``tables`` alone while the run is live (a directory listing), else the run's
    ``version``: the key under which ``memo`` keeps a chart that reads only those tables, so the
    Loss chart is not rebuilt because comm records landed."""
    run_id = run_id or sel.run_id
    return queries.table_version(sel.data_dir, run_id, tables) if sel.is_live(run_id) else version


def live(sel: Selection, body: Callable[[str], None], run_id: str | None = None) -> None:
    """Render ``body(data_version)``; while the run is live, as a fragment that re-renders in
    place every REFRESH_S (not a whole-page rerun) and stops once the run has ended.

    One fragment per page, not one per chart: each fragment rerun costs Streamlit ~20 ms of CPU
    before any chart is drawn (measured: 8 one-line fragments at 1 s took 210 ms/s of a core, one
    took 66 ms/s), more than a chart whose data did not move. What keeps a refresh cheap is inside
    ``body``: each chart is rebuilt only when the tables it reads moved (``memo`` under
    ``tables_version``) and is otherwise sent again unchanged, which the browser does not redraw;
    the run's status is re-read only when its data moved or every STATUS_EVERY_S."""
    run_id = run_id or sel.run_id
    if not sel.is_live(run_id):
        _guarded(body, queries.data_version(sel.data_dir, run_id))
        return

    @st.fragment(run_every=REFRESH_S)
    def refreshing() -> None:
        version = queries.data_version(sel.data_dir, run_id)
        if not _still_live(sel.data_dir, run_id, version):
            st.rerun()  # the run ended: redraw the page once, without the timer
        step = queries.latest_step(sel.data_dir, run_id, version)
        st.caption(f"Live: refreshing every {REFRESH_S:g} s · latest step {'–' if step is None else step}")
        _guarded(body, version)

    refreshing()


LIVENESS_PAGE = "views/liveness.py"  # relative to app/, as main.py declares it


def liveness_banner() -> None:
    """Declared once by main.py, above every page: a red banner while the selected run has a stuck
    or hung collective, a collective mismatch or a silent rank, linking to the Liveness page
    (wavefront and stacks). While the run is live it re-checks every LIVENESS_REFRESH_S, in place,
    from the findings the live collector holds (the same as `rankscope health`'s), or from the
    data dir when no collector follows the run."""
    directory = st.session_state.get("rankscope.data_dir")
    runs = st.session_state.get("rankscope.runs")
    chosen = st.session_state.get(SELECTION_KEY) or ()
    if not directory or runs is None or runs.empty or not chosen:
        return
    run_id = chosen[0]

    def show() -> None:
        found = queries.live_attention(directory, run_id)
        if found is None:
            try:
                version = queries.data_version(directory, run_id)
                found = [f.text for f in queries.liveness_findings(directory, run_id, version)]
            except (duckdb.Error, queries.DataDirError):
                return  # the page itself says what is wrong with the data
        if not found:
            return
        lines = "\n".join(f"- {text}" for text in found[:5])
        more = f"\n- … and {len(found) - 5} more" if len(found) > 5 else ""
        st.error(f"**This run needs attention now**\n{lines}{more}", icon=":material/error:")
        st.page_link(LIVENESS_PAGE, label="Wavefront and stacks", icon=":material/arrow_forward:")

    if runs.loc[runs.run_id == run_id, "status"].eq("running").any():
        st.fragment(run_every=LIVENESS_REFRESH_S)(show)()
    else:
        show()
