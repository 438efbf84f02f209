"""A live run streamed through the real collector (gRPC, Parquet segments, catalog)
while the dashboard is open in Chromium: the page updates in place as records
arrive, names the late rank, and stops refreshing once every rank has ended."""

from __future__ import annotations

import pytest

from collector.testing.collectors import live_collector
from collector.testing.dashboard import DashboardProcess, browser_tab
from collector.testing.fake_runs import comm_envelope, hello, run_end
from collector.testing.streams import RawStream
from tests.integration._browser import NEEDS_CHROMIUM, SCREENSHOTS

WORLD, LATE_RANK, PER_BATCH = 4, 3, 100  # comm_columns: 10 collectives per step, so 10 steps a batch
RUN = "live-job"

pytestmark = NEEDS_CHROMIUM


@pytest.fixture
def collector(tmp_path):
    with live_collector(tmp_path / "data", grace_s=0) as live:
        yield live.channel(), live.data_dir


def send_batch(streams: list[RawStream], batch: int) -> None:
    """Batch b of every rank: collectives b*PER_BATCH.., rank 3 arriving 2 µs late."""
    for rank, stream in enumerate(streams):
        stream.send(
            comm_envelope(
                f"c{rank}",
                2 + batch,
                RUN,
                rank,
                batch * PER_BATCH,
                PER_BATCH,
                delay_ns=2000 if rank == LATE_RANK else 0,
                group_size=WORLD,
            )
        )
    for stream in streams:
        assert stream.wait_acked([2 + batch]), "collector did not ack the batch"


def test_live_run_updates_in_place_and_stops_when_ended(collector):
    channel, data_dir = collector
    streams = [RawStream(channel) for _ in range(WORLD)]
    for rank, stream in enumerate(streams):
        stream.send(hello(f"c{rank}", 1, RUN, rank, WORLD))
    send_batch(streams, 0)

    dashboard = DashboardProcess(data_dir)
    try:
        with browser_tab() as tab:
            tab.goto(f"{dashboard.url}/stragglers?run={RUN}")
            tab.get_by_text("latest step 9").wait_for(timeout=60_000)
            tab.get_by_text(f"rank {LATE_RANK} arrives last in 100%").wait_for(timeout=30_000)
            tab.evaluate("window.__not_reloaded = true")

            send_batch(streams, 1)  # steps 10..19 arrive while the page is open
            tab.get_by_text("latest step 19").wait_for(timeout=30_000)
            assert tab.evaluate("window.__not_reloaded === true")
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            tab.screenshot(path=str(SCREENSHOTS / "live-stragglers.png"), full_page=True)

            for rank, stream in enumerate(streams):
                stream.send(run_end(f"c{rank}", 100, RUN, rank))
                stream.finish()
            tab.get_by_text("Live: refreshing").wait_for(state="detached", timeout=30_000)
            tab.wait_for_timeout(2500)  # two refresh periods: nothing brings it back
            assert tab.get_by_text("Live: refreshing").count() == 0
            assert tab.get_by_text(f"rank {LATE_RANK} arrives last in 100%").count() >= 1
    finally:
        dashboard.stop(timeout=10)
