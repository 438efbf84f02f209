"""Who may talk to a collector: bearer token on both RPCs (checked before anything
is decoded), TLS (a plaintext client gets nothing), and the bind policy of
``rankscope collect`` (loopback by default; a wider address needs a token or
``--insecure``, which warns).

Split by tier: the pure-function tests are in tests/unit/server/test_access.py."""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import sys

import grpc
import pytest

from collector.data import security
from collector.rank.client import Client, ClientConfig
from collector.rank.records import RecordBuffer
from collector.testing.collectors import live_collector, stored_rows
from collector.testing.fake_runs import comm_envelope, hello, run_end
from collector.testing.pki import OpenSSLMissing, make_pki
from collector.testing.streams import RawStream
from proto import pb, pb_grpc
from tests.unit.server.test_access import TOKEN

HEALTH = "/rankscope.v1.Collector/Health"
STREAM = "/rankscope.v1.Collector/Stream"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    try:
        return make_pki(tmp_path_factory.mktemp("pki"))
    except OpenSSLMissing as exc:
        pytest.skip(str(exc))


@pytest.fixture
def served(tmp_path):
    """start(token=None, tls=None) -> (port, state) of a collector over tmp_path/data."""
    with contextlib.ExitStack() as running:

        def start(token=None, tls=None):
            live = running.enter_context(live_collector(tmp_path / "data", token=token, tls=tls, grace_s=0))
            return live.port, live.state

        yield start


def _code(fn) -> grpc.StatusCode:
    try:
        fn()
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


# -- token ----------------------------------------------------------------------

WRONG = [
    None,
    [("authorization", "Bearer nope")],
    [("authorization", TOKEN)],
    [("authorization", f"bearer {TOKEN}")],
    [("authorization", f"Bearer {TOKEN}x")],
    [("authorization", f"Bearer {TOKEN[:-1]}")],
]


@pytest.mark.parametrize("metadata", WRONG, ids=["none", "wrong", "no-scheme", "lowercase", "longer", "shorter"])
def test_every_rpc_refuses_a_missing_or_wrong_token_before_decoding(served, tmp_path, metadata):
    port, _ = served(token=TOKEN)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        health = channel.unary_unary(HEALTH, request_serializer=None, response_deserializer=None)
        stream = channel.stream_stream(STREAM, request_serializer=None, response_deserializer=None)
        # Garbage bodies: were they decoded first, the answer would be INVALID_ARGUMENT.
        for body in (pb.HealthRequest().SerializeToString(), b"\xff\xff\xff garbage"):
            assert _code(lambda b=body: health(b, metadata=metadata, timeout=10)) == grpc.StatusCode.UNAUTHENTICATED
        for body in (comm_envelope("c", 1, "r", 0, 0, 10).SerializeToString(), b"\xff\xff\xff garbage"):
            assert (
                _code(lambda b=body: list(stream(iter([b]), metadata=metadata, timeout=10)))
                == grpc.StatusCode.UNAUTHENTICATED
            )
        try:
            pb_grpc.CollectorStub(channel).Health(pb.HealthRequest(), metadata=metadata, timeout=10)
        except grpc.RpcError as exc:
            assert "bearer token" in exc.details() and TOKEN not in exc.details()
    assert stored_rows(tmp_path / "data") == 0


def test_the_right_token_passes_on_both_rpcs_and_garbage_is_then_invalid_argument(served, tmp_path):
    port, _ = served(token=TOKEN)
    good = security.auth_metadata(TOKEN)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.CollectorStub(channel)
        assert stub.Health(pb.HealthRequest(), metadata=good, timeout=10).schema_version == 1
        health = channel.unary_unary(HEALTH, request_serializer=None, response_deserializer=None)
        assert _code(lambda: health(b"\xff\xff\xff", metadata=good, timeout=10)) == grpc.StatusCode.INVALID_ARGUMENT
        s = RawStream(channel, metadata=good)
        s.send(hello("c", 1, "r", 0, 1), comm_envelope("c", 2, "r", 0, 0, 10), run_end("c", 3, "r", 0))
        s.finish()
        assert s.error is None and s.acked == {1, 2, 3}
    assert stored_rows(tmp_path / "data") == 10


# -- TLS ------------------------------------------------------------------------


def test_tls_collector_serves_a_client_that_trusts_its_ca_and_no_one_else(served, tmp_path, pki):
    port, _ = served(token=TOKEN, tls=security.ServerTLS(cert=pki.cert, key=pki.key))
    endpoint = f"127.0.0.1:{port}"
    request = pb.HealthRequest()

    with security.open_channel(endpoint, tls_ca=pki.ca) as channel:
        reply = pb_grpc.CollectorStub(channel).Health(request, metadata=security.auth_metadata(TOKEN), timeout=10)
        assert reply.schema_version == 1
        # TLS does not replace the token
        assert (
            _code(lambda: pb_grpc.CollectorStub(channel).Health(request, timeout=10)) == grpc.StatusCode.UNAUTHENTICATED
        )
    # plaintext, or a CA that did not sign the certificate: no RPC gets through
    with grpc.insecure_channel(endpoint) as channel:
        assert (
            _code(
                lambda: pb_grpc.CollectorStub(channel).Health(
                    request, metadata=security.auth_metadata(TOKEN), timeout=5
                )
            )
            == grpc.StatusCode.UNAVAILABLE
        )
        s = RawStream(channel, metadata=security.auth_metadata(TOKEN))
        s.send(comm_envelope("plain", 1, "r", 0, 0, 10))
        assert s.done.wait(10) and s.error.code() == grpc.StatusCode.UNAVAILABLE and not s.acked
    with security.open_channel(endpoint, tls_ca=pki.other_ca) as channel:
        assert (
            _code(
                lambda: pb_grpc.CollectorStub(channel).Health(
                    request, metadata=security.auth_metadata(TOKEN), timeout=5
                )
            )
            == grpc.StatusCode.UNAVAILABLE
        )
    assert stored_rows(tmp_path / "data") == 0


def _client_of_a_tls_collector(served, tmp_path, pki, name: str, run: str, **config) -> tuple[Client, RecordBuffer]:
    """A rank client (the token, a fast flush, ``config``) started on ``run`` against a collector that
    wants TLS and the token."""
    port, _ = served(token=TOKEN, tls=security.ServerTLS(cert=pki.cert, key=pki.key))
    buffer = RecordBuffer()
    cfg = ClientConfig(
        endpoint=f"127.0.0.1:{port}", token=TOKEN, spool_dir=tmp_path / "spool", flush_interval_s=0.05, **config
    )
    client = Client(cfg, name, buffer)
    client.start(pb.Hello(run_id=run, run_name=run, rank=0, world_size=1))
    return client, buffer


def test_the_rank_client_streams_over_tls_with_a_token(served, tmp_path, pki):
    client, buffer = _client_of_a_tls_collector(served, tmp_path, pki, "tls-client", "tlsrun", tls_ca=str(pki.ca))
    for i in range(500):
        buffer.add_row("timers", {"name": "fwd", "dur_ns": 1000 + i}, step=i)
    assert client.close(pb.RunEnd(run_id="tlsrun", rank=0, status="finished"), timeout_s=20)
    assert stored_rows(tmp_path / "data", "timers") == 500
    assert not list((tmp_path / "spool").glob("*")), "everything was acked, nothing left spooled"


def test_a_plaintext_rank_client_spools_instead_of_reaching_a_tls_collector(served, tmp_path, pki):
    client, buffer = _client_of_a_tls_collector(served, tmp_path, pki, "plain-client", "plainrun", close_timeout_s=1.0)
    for i in range(100):
        buffer.add_row("timers", {"name": "fwd", "dur_ns": 1}, step=i)
    assert not client.close(pb.RunEnd(run_id="plainrun", rank=0, status="finished"), timeout_s=1.0)
    assert stored_rows(tmp_path / "data", "timers") == 0
    assert list((tmp_path / "spool").glob("*")), "nothing was kept for a later resend"


def test_tls_files_are_checked_with_clear_errors(tmp_path, pki):
    with pytest.raises(security.SecurityConfigError, match="both --tls-cert and --tls-key"):
        security.ServerTLS.from_args(pki.cert, None)
    with pytest.raises(security.SecurityConfigError, match=r"missing\.pem"):
        security.ServerTLS(cert=tmp_path / "missing.pem", key=pki.key).credentials()
    with pytest.raises(security.SecurityConfigError, match="holds no private key"):
        security.ServerTLS(cert=pki.cert, key=pki.cert).credentials()
    (tmp_path / "junk.pem").write_text("not a certificate")
    with pytest.raises(security.SecurityConfigError, match="not a PEM file"):
        security.open_channel("127.0.0.1:1", tls_ca=tmp_path / "junk.pem")


def _collect(tmp_path, *args, env_token=None):
    import os

    env = {k: v for k, v in os.environ.items() if k != "RANKSCOPE_TOKEN"}
    if env_token:
        env["RANKSCOPE_TOKEN"] = env_token
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "collector.tools.cli",
            "collect",
            "--data-dir",
            str(tmp_path / "data"),
            "--port",
            "0",
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    return proc


def _stop(proc) -> tuple[str, str]:
    proc.send_signal(signal.SIGTERM)
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return out, err


def test_cli_refuses_a_wide_bind_without_token_and_warns_with_insecure(tmp_path):
    refused = _collect(tmp_path, "--host", "0.0.0.0")
    _, err = refused.communicate(timeout=60)
    assert refused.returncode == 2
    assert "refusing to listen on 0.0.0.0 without a token" in err and "--insecure" in err
    assert "Traceback" not in err and not (tmp_path / "data" / "ledger").exists()

    opened = _collect(tmp_path, "--host", "0.0.0.0", "--insecure")
    line = opened.stdout.readline()
    _out, err = _stop(opened)
    assert re.search(r"listening on 0\.0\.0\.0:\d+ \(plaintext, no token", line), line
    assert "WARNING" in err and "no token" in err and "without TLS" in err
    assert opened.returncode == 0


def test_cli_collect_with_env_token_and_tls(tmp_path, pki):
    proc = _collect(tmp_path, "--tls-cert", str(pki.cert), "--tls-key", str(pki.key), env_token=TOKEN)
    line = proc.stdout.readline()
    try:
        match = re.search(r"listening on 127\.0\.0\.1:(\d+) \(TLS, token required", line)
        assert match, line
        with security.open_channel(f"127.0.0.1:{match.group(1)}", tls_ca=pki.ca) as channel:
            stub = pb_grpc.CollectorStub(channel)
            assert (
                stub.Health(pb.HealthRequest(), metadata=security.auth_metadata(TOKEN), timeout=20).schema_version == 1
            )
            assert _code(lambda: stub.Health(pb.HealthRequest(), timeout=10)) == grpc.StatusCode.UNAUTHENTICATED
    finally:
        _out, err = _stop(proc)
    assert proc.returncode == 0 and "WARNING" not in err

    bad = _collect(tmp_path, "--tls-cert", str(pki.cert))
    _, err = bad.communicate(timeout=60)
    assert bad.returncode == 2 and "both --tls-cert and --tls-key" in err


def test_telemetry_start_takes_tls_ca_and_token_from_the_environment(served, tmp_path, pki, monkeypatch):
    from collector.rank import session

    port, _ = served(token=TOKEN, tls=security.ServerTLS(cert=pki.cert, key=pki.key))
    monkeypatch.setenv("RANKSCOPE_ENDPOINT", f"127.0.0.1:{port}")
    monkeypatch.setenv("RANKSCOPE_TOKEN", TOKEN)
    monkeypatch.setenv("RANKSCOPE_TLS_CA", str(pki.ca))
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    try:
        active = session.start(run="tls-env")
        assert active is not None and active.client_config.tls_ca == str(pki.ca)
        for step in range(50):
            session.emit("timers", step=step, name="fwd", dur_ns=step)
    finally:
        session.stop()
    assert stored_rows(tmp_path / "data", "timers") == 50
    assert stored_rows(tmp_path / "data", "rank_ends") == 1


def test_import_watch_and_replay_reach_a_tls_collector_with_tls_ca_and_token(tmp_path, pki, capsys):
    from tests._import_util import FIXTURE, query, rankscope

    data, incoming = tmp_path / "data", tmp_path / "incoming"
    incoming.mkdir()
    (incoming / "comms_summary_rank0.json").write_bytes((FIXTURE / "comms_summary_rank0.json").read_bytes())
    with live_collector(data, token=TOKEN, tls=security.ServerTLS(cert=pki.cert, key=pki.key)) as (endpoint, _):
        through = ["--endpoint", endpoint, "--token", TOKEN, "--tls-ca", pki.ca]
        assert rankscope("import", FIXTURE / "comms_summary_rank1.json", "--run", "imported", *through) == 0
        assert rankscope("import", "--watch", incoming, "--once", "--settle", "0", "--run", "watched", *through) == 0
        (imported,) = query(data, "SELECT run_id FROM runs WHERE name = 'imported'")[0]
        assert rankscope("replay", data, "--run", imported, "--speed", "0", "--name", "replayed", *through) == 0
        # a CA file that is not there is one clear error, before anything is sent
        capsys.readouterr()
        assert (
            rankscope(
                "import",
                FIXTURE / "comms_summary_rank1.json",
                "--endpoint",
                endpoint,
                "--tls-ca",
                tmp_path / "missing.pem",
            )
            == 1
        )
        assert "missing.pem" in capsys.readouterr().err
    runs = dict(query(data, "SELECT name, count(*) FROM runs JOIN comm USING (run_id) GROUP BY name"))
    assert set(runs) == {"imported", "watched", "replayed"} and runs["replayed"] == runs["imported"] > 0
