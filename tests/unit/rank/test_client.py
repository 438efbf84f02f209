"""The rank-side client against a real gRPC server on a real port: acks,
reconnect with the same seqs, spooling while nothing listens, rejected batches,
tokens, the memory bound. The server is tests/integration/rank/_rank_util.RecordingCollector.

Split by tier: what needs processes, sockets or seconds is in tests/integration/rank/test_client.py."""

from __future__ import annotations

import logging

import pytest

from collector.rank import spool
from collector.rank.client import ClientConfig
from collector.rank.records import RecordBuffer
from proto import pb


def test_unknown_table_or_column_is_dropped_with_a_named_warning(caplog):
    buf = RecordBuffer()
    with caplog.at_level(logging.WARNING, logger="rankscope.records"):
        assert not buf.add_row("nosuch", {"x": 1}, step=0)
        assert not buf.add_row("timers", {"name": "a", "wat": 1}, step=0)
    assert "unknown table 'nosuch'" in caplog.text
    assert "timers.wat is not a column" in caplog.text


def test_spool_file_format_round_trip_and_bad_file(tmp_path):
    envs = [pb.Envelope(schema_version=1, client_id="c", seq=s, end=pb.RunEnd(run_id="x")) for s in (4, 5, 9)]
    path = spool.write(tmp_path, "c", envs)
    assert path.name == "c-000000000004-000000000009.rsspool"
    assert [e.seq for e in spool.read(path)] == [4, 5, 9]
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(spool.SpoolError, match="file ends first"):
        spool.read(path)
    (tmp_path / "junk.rsspool").write_bytes(b"hello")
    with pytest.raises(spool.SpoolError, match="bad magic"):
        spool.read(tmp_path / "junk.rsspool")
    (tmp_path / "cut.rsspool").write_bytes(spool.MAGIC + b"\xff\x00\x00\x00host")
    with pytest.raises(spool.SpoolError, match="endpoint header of 255 bytes"):
        spool.read(tmp_path / "cut.rsspool")


def test_spool_file_records_its_endpoint_and_old_files_still_read(tmp_path):
    envs = [pb.Envelope(schema_version=1, client_id="c", seq=s, end=pb.RunEnd(run_id="x")) for s in (1, 2)]
    path = spool.write(tmp_path, "c", envs, "collector.example:50051")
    assert spool.endpoint_of(path) == "collector.example:50051"
    assert [e.seq for e in spool.read(path)] == [1, 2]
    # a file from before the endpoint header (RSSPOOL1): records follow the magic directly
    old = tmp_path / "old-000000000001-000000000001.rsspool"
    data = envs[0].SerializeToString()
    old.write_bytes(b"RSSPOOL1" + len(data).to_bytes(4, "little") + data)
    assert spool.endpoint_of(old) is None and [e.seq for e in spool.read(old)] == [1]


@pytest.mark.parametrize(
    "given, message",
    [
        (dict(endpoint=""), "telemetry.endpoint: must be host:port (got '')"),
        (dict(endpoint=None), "telemetry.endpoint: must be a string (got None)"),
        (dict(batch_rows=0), "telemetry.batch_rows: must be >= 1 (got 0)"),
        (dict(max_unacked_bytes=1.5), "telemetry.max_unacked_bytes: must be an integer (got 1.5)"),
        (dict(flush_interval_s=-0.1), "telemetry.flush_interval_s: must be >= 0 (got -0.1)"),
        (dict(close_timeout_s="5"), "telemetry.close_timeout_s: must be a finite number (got '5')"),
    ],
)
def test_client_config_errors_name_the_telemetry_key(given, message):
    with pytest.raises(ValueError) as err:
        ClientConfig(**given)
    assert str(err.value) == message


def test_client_config_spool_dir_defaults_per_user(tmp_path):
    assert ClientConfig(spool_dir=str(tmp_path)).spool_dir == tmp_path
    assert ClientConfig().spool_dir == spool.default_dir()


def test_the_spool_beyond_max_spool_bytes_drops_its_oldest_files_counted(tmp_path, caplog):
    from collector.rank.client import Client

    client = Client(ClientConfig(spool_dir=tmp_path, max_spool_bytes=3000), "h.1.x", RecordBuffer())
    client._hello = client._envelope(end=pb.RunEnd(run_id="r"))  # stands in for the Hello (seq 1)
    with caplog.at_level(logging.WARNING, logger="rankscope.client"):
        for _ in range(6):  # six files of ~1 KB, 10 rows each
            env = client._envelope(end=pb.RunEnd(run_id="r" * 1000))
            client._rows_of[env.seq] = 10
            client._track(env, 10)
            with client._lock:
                client._spool_unacked()
    files = sorted(tmp_path.glob("*.rsspool"))
    assert sum(f.stat().st_size for f in files) <= 3000 and len(files) == 2
    assert files[-1].name.endswith("-000000000007.rsspool")  # the newest stays
    assert client.spool_dropped == client.dropped_unspooled == 40  # four files of 10 rows
    assert caplog.text.count("is over 3000 bytes: dropping its oldest records") == 1


def test_a_cut_noticed_late_is_said_from_the_last_ack_not_from_when_it_was_noticed(caplog):
    """A partition hangs the stream: the keepalive notices it ~20 s after the last ack. The warning
    then says how long the records have gone unanswered (since that ack), not 3 s."""
    import time

    from collector.rank.client import UNREACHABLE_WARN_S, Client

    client = Client(ClientConfig(), "h.1.x", RecordBuffer())
    client._track(client._envelope(end=pb.RunEnd(run_id="r")), 10)  # sent, never acked
    now = time.monotonic()
    client._last_ack_at = now - 23.0  # the last ack, before the cut
    client._outage_since = now - UNREACHABLE_WARN_S - 0.1  # the broken stream, noticed just now
    with caplog.at_level(logging.WARNING, logger="rankscope.client"):
        client._warn_if_unreachable()
    assert "has not answered for 23 s" in caplog.text, caplog.text
