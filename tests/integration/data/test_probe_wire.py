"""The link probe's wire (collector.data.probe_wire) over real loopback sockets: both ways timed with
every byte moved, a wrong token or an oversized ask dropped before a byte is served, a transfer cut
at its bound measured over what it moved, and a listener that closes after its window."""

from __future__ import annotations

import secrets
import socket
import time

import pytest

from collector.data import probe_wire
from collector.testing.gloo import wait_for

MiB = 1 << 20


@pytest.fixture
def listener():
    token = secrets.token_hex(probe_wire.TOKEN_CHARS // 2)
    lis = probe_wire.Listener(token, max_bytes=16 * MiB, window_s=30, host="127.0.0.1")
    yield token, lis
    lis.close()


def test_both_ways_move_every_byte_and_are_timed(listener):
    token, lis = listener
    address = f"127.0.0.1:{lis.port}"
    sent = probe_wire.exchange(address, token, "send", 8 * MiB, 5.0)
    got = probe_wire.exchange(address, token, "receive", 8 * MiB, 5.0)
    for t in (sent, got):
        assert t.complete and t.bytes == 8 * MiB and t.seconds > 0
        assert t.mbit_s == pytest.approx(8 * MiB * 8 / t.seconds / 1e6)
    # the listener counts an exchange after its last byte, on its own thread: the client may be back first
    assert wait_for(lambda: lis.served == 2, 10), lis.served


def test_a_wrong_token_or_an_oversized_ask_is_dropped_before_a_byte_is_served(listener):
    token, lis = listener
    address = f"127.0.0.1:{lis.port}"
    with pytest.raises(OSError):
        probe_wire.exchange(address, "0" * probe_wire.TOKEN_CHARS, "receive", 1 * MiB, 2.0)
    with pytest.raises(OSError):
        probe_wire.exchange(address, token, "receive", 64 * MiB, 2.0)  # over the listener's 16 MiB
    assert probe_wire.exchange(address, token, "receive", 1 * MiB, 2.0).complete  # it still serves the right ask


def test_a_transfer_is_cut_at_its_bound_and_measured_over_what_it_moved():
    # a peer that accepts (the kernel's backlog) but never reads: the send fills the socket buffers and stops
    with socket.create_server(("127.0.0.1", 0)) as silent:
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        t = probe_wire.exchange(address, "0" * probe_wire.TOKEN_CHARS, "send", 64 * MiB, 0.5)
        took = time.monotonic() - started
    assert 0.5 <= took < 3.0
    assert not t.complete
    assert 0 < t.bytes < 64 * MiB
    # the bound counts the connect, the seconds the transfer after it (CI beside other jobs: 0.494 s)
    assert 0.4 <= t.seconds <= took


def test_a_listener_takes_nothing_after_its_window():
    token = secrets.token_hex(probe_wire.TOKEN_CHARS // 2)
    lis = probe_wire.Listener(token, window_s=0.3, host="127.0.0.1")
    deadline = time.monotonic() + 5
    while lis.open() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not lis.open()
    with pytest.raises(OSError):
        probe_wire.exchange(f"127.0.0.1:{lis.port}", token, "receive", 1 * MiB, 1.0)
