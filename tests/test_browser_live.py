"""A live run streamed through the real collector (gRPC, Parquet segments, catalog)
while the dashboard is open in Chromium: the page updates in place as records
arrive, names the late rank, and stops refreshing once every rank has ended."""
from __future__ import annotations

import os

import grpc
import pytest

from _server_util import RawStream, comm_envelope, hello, run_end
from collector.server.compaction import CompactionConfig
from collector.server.service import create_server
from collector.server.store import StoreConfig
from conftest import free_port
from test_browser_dashboard import CHROMIUM, SCREENSHOTS, launch_chromium, start_dashboard, stop

WORLD, LATE_RANK, PER_BATCH = 4, 3, 100  # comm_columns: 10 collectives per step, so 10 steps a batch
RUN = "live-job"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"Debian's chromium is not installed at {CHROMIUM}"),
]


@pytest.fixture
def collector(tmp_path):
    server, port, state = create_server("127.0.0.1:0", tmp_path / "data", store_config=StoreConfig(flush_interval=0.05),
                                        compaction_config=CompactionConfig(interval=3600))
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield channel, tmp_path / "data"
    channel.close()
    server.stop(0).wait()
    state.close()


def send_batch(streams: list[RawStream], batch: int) -> None:
    """Batch b of every rank: collectives b*PER_BATCH.., rank 3 arriving 2 µs late."""
    for rank, stream in enumerate(streams):
        stream.send(comm_envelope(f"c{rank}", 2 + batch, RUN, rank, batch * PER_BATCH, PER_BATCH,
                                  delay_ns=2000 if rank == LATE_RANK else 0, group_size=WORLD))
    for stream in streams:
        assert stream.wait_acked([2 + batch]), "collector did not ack the batch"


def test_live_run_updates_in_place_and_stops_when_ended(collector):
    from playwright.sync_api import sync_playwright

    channel, data_dir = collector
    streams = [RawStream(channel) for _ in range(WORLD)]
    for rank, stream in enumerate(streams):
        stream.send(hello(f"c{rank}", 1, RUN, rank, WORLD))
    send_batch(streams, 0)

    port = free_port()
    proc = start_dashboard(data_dir, port)
    try:
        with sync_playwright() as p:
            browser = launch_chromium(p)
            tab = browser.new_page(viewport={"width": 1400, "height": 1000})
            tab.goto(f"http://127.0.0.1:{port}/stragglers?run={RUN}")
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
            browser.close()
    finally:
        stop(proc, timeout=10)
