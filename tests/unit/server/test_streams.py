"""The collector's stream limits, against a real server on a real port with real clients:
idle streams cannot lock out ranks or Health, silent streams are closed, one peer cannot
hold more than its share, and a flooding stream is held to its budget.

Split by tier: what needs processes, sockets or seconds is in tests/integration/server/test_streams.py."""

from __future__ import annotations

import pytest

from collector.server.limits import PeerStreams, StreamBudget, StreamLimits, peer_host

# ---- the pieces, as pure functions ----


def test_budget_allows_a_second_of_burst_then_the_rate():
    limits = StreamLimits(rows_per_s=100, bytes_per_s=1e9)
    budget = StreamBudget(limits, now=0.0)
    assert budget.wait_s(0.0) == 0
    budget.spend(150, 10, now=0.0)  # one message may overdraw the bucket
    assert budget.wait_s(0.0) == pytest.approx(0.5)
    assert budget.wait_s(0.25) == pytest.approx(0.25)
    assert budget.wait_s(0.5) == 0
    budget.spend(10, 10, now=0.5)
    assert budget.wait_s(0.6) == pytest.approx(0, abs=1e-9)  # refilled 10 rows by then
    assert budget.wait_s(10.0) == 0 and budget.rows == 100  # never more than one second's worth


def test_byte_budget_binds_as_well():
    budget = StreamBudget(StreamLimits(rows_per_s=1e9, bytes_per_s=1000), now=0.0)
    budget.spend(1, 3000, now=0.0)
    assert budget.wait_s(0.0) == pytest.approx(2.0)


def test_peer_streams_count_per_address():
    peers = PeerStreams(2)
    assert peers.open("a") is None and peers.open("a") is None
    assert "limit per peer" in peers.open("a")
    assert peers.open("b") is None
    peers.close("a")
    assert peers.open("a") is None


@pytest.mark.parametrize(
    ("peer", "host"),
    [("ipv4:10.0.0.7:51234", "10.0.0.7"), ("ipv6:[::1]:5", "::1"), ("unix:/tmp/s", "unix:/tmp/s")],
)
def test_peer_host(peer, host):
    assert peer_host(peer) == host


def test_stream_limits_name_the_dotted_key():
    from collector.data.config import ConfigError

    with pytest.raises(ConfigError, match=r"streams\.idle_timeout_s"):
        StreamLimits.from_dict({"idle_timeout_s": 0}, key="streams")
