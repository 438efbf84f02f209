"""The collector's Prometheus endpoint and alert webhook, end to end: a live 2-rank hook run
(rank 1 late to every all_reduce) streams into a real collector; a real Prometheus server
scrapes its /metrics and answers a ``rankscope_`` series per rank over its HTTP API; a local
HTTP server receives one webhook post per new finding, never the same finding twice.

Split by tier: what needs processes, sockets or seconds is in tests/integration/server/test_metrics.py."""

from __future__ import annotations

import pytest


def test_the_exposed_comm_gauge_is_the_overviews_definition_over_the_recent_steps():
    """recent_exposed_share is exposed_shares (what the Overview reports) over each rank's last
    ``window`` finished steps: (comm - overlapped) / step, overlapping collectives counted once."""
    from collector.data.findings.communication import exposed_shares, recent_exposed_share
    from collector.testing.step_frames import step_rows

    steps = step_rows(4, 30, comm_ms=60.0)  # overlapped 30 of 60 ms per 100 ms step: 30% exposed
    # the last 5 steps of rank 2 spend 90 ms in collectives, 10 beside compute; its newest step is left out
    late = (steps["rank"] == 2) & (steps.step >= 24)
    steps.loc[late, ["comm_ms", "overlapped_ms"]] = [90.0, 10.0]
    steps.loc[(steps["rank"] == 2) & (steps.step == 29), "comm_ms"] = 100.0
    share = recent_exposed_share(steps, window=5).set_index("rank").exposed
    assert share.to_dict() == pytest.approx({0: 0.3, 1: 0.3, 2: 0.8, 3: 0.3})
    same = exposed_shares(steps[(steps.step >= 24) & (steps.step <= 28)]).set_index("rank").exposed
    assert share.to_dict() == pytest.approx(same.to_dict())
    # without step timers a step is the span of its communication: no share to report
    assert recent_exposed_share(steps.assign(timed=False), window=5).empty
