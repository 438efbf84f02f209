"""The dashboard's "Profile now" in a real headless Chromium (issue 32): a real collector with the
request-file poller ``rankscope collect`` runs (collector.server.request_files), 4 real gloo
ranks with the hook attached, rank 1 late in ``slow_loader`` from the start. The live Overview names
the straggler with a "Profile rank 1 now" button; until it is clicked nobody is asked anything.
The click leaves the request in the data dir, the collector has rank 1 and a reference rank it
picks profile their next steps, and the page shows the diff naming the function, with both traces
merged to download (Perfetto JSON, a process per rank).

Waits poll what the page shows with generous deadlines (the machine is shared); ~40 s, so slow."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collector.server.request_files import RequestFiles
from collector.testing.collectors import live_collector
from collector.testing.dashboard import DashboardProcess, browser_tab
from collector.testing.gloo import wait_for
from tests.integration._browser import NEEDS_CHROMIUM, SCREENSHOTS
from tests.integration.test_evidence import _spawn, _stop_and_join, _streaming

pytestmark = [*NEEDS_CHROMIUM, pytest.mark.slow]

BUTTON = "Profile rank 1 now"


def test_profile_now_on_the_overview_captures_both_ranks_and_shows_the_diff(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    with live_collector(tmp_path / "data") as collector:
        poller = RequestFiles(collector.state, interval_s=0.2)
        ctx = _spawn(collector.endpoint, out)
        dashboard = None
        try:
            run_id = wait_for(lambda: _streaming(collector), 300)
            assert run_id, "the 4 ranks never streamed"
            dashboard = DashboardProcess(collector.data_dir)
            with browser_tab(height=1400) as tab:
                tab.goto(f"{dashboard.url}/overview?run={run_id}")
                button = tab.get_by_role("button", name=BUTTON).first
                button.wait_for(timeout=300_000)  # the straggler finding, live, with its button
                assert not poller.handled and not collector.state.commands.sent  # nobody asked before the click
                button.click()

                tab.get_by_text("Asked:", exact=False).first.wait_for(timeout=60_000)
                evidence = tab.get_by_text("Evidence (profiled steps", exact=False).first
                evidence.wait_for(timeout=300_000)
                assert "slow_loader" in evidence.inner_text().split(";")[0], evidence.inner_text()
                [(request_id, outcome)] = poller.handled
                assert outcome.startswith("sent"), outcome
                asked = {rank for _, _, rank, _, _, rid in collector.state.commands.sent if rid == request_id}
                assert 1 in asked and len(asked) == 2, collector.state.commands.sent  # rank 1 and a reference
                SCREENSHOTS.mkdir(parents=True, exist_ok=True)
                tab.screenshot(path=str(SCREENSHOTS / "profile-now-evidence.png"), full_page=True)

                with tab.expect_download(timeout=60_000) as download:
                    tab.get_by_role("button", name="Download both traces (Perfetto JSON)").first.click()
                merged = json.loads(Path(download.value.path()).read_text())
                processes = {e["args"]["name"] for e in merged["traceEvents"] if e.get("name") == "process_name"}
                [reference] = asked - {1}
                assert processes == {"rank 1 (suspect)", f"rank {reference} (reference)"}, processes
        finally:
            if dashboard is not None:
                dashboard.stop(timeout=10)
            poller.close()
            _stop_and_join(ctx, out)
