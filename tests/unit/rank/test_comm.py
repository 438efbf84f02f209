"""collector.rank.comm, telemetry and hook in one process: config errors, the
comms-logger behaviours (verbose, debug caller, prof_ops, summary), run
identity, attach/detach, and never raising into training. Multi-rank
behaviour is in tests/*/rank/test_e2e.py.

Split by tier: what needs processes, sockets or seconds is in tests/integration/rank/test_comm.py."""

from __future__ import annotations

import pytest

from collector.rank import comm, recorder, session


def test_comms_logger_config_errors_name_the_key():
    with pytest.raises(ValueError, match=r"comms_logger\.enabled: must be true or false"):
        comm.configure({"enabled": "yes"})
    with pytest.raises(ValueError, match=r"comms_logger\.prof_ops: must be a list of strings"):
        comm.configure({"prof_ops": "all_reduce"})
    with pytest.warns(UserWarning, match=r"ignoring unknown config keys: comms_logger\.verbos"):
        comm.configure({"verbos": True})
    comm.configure({})
    assert recorder.REC.on is False


def test_telemetry_config_errors_name_the_key(monkeypatch):
    with pytest.raises(ValueError, match=r"telemetry\.run: must be a string or null"):
        session.start(config={"telemetry": {"run": 3}})
    with pytest.raises(ValueError, match=r"telemetry\.run: must be a non-empty string"):
        session.start(config={"telemetry": {"run": " "}})
    assert session.active() is None
    with pytest.warns(UserWarning, match=r"ignoring unknown config keys: telemetry\.endpont"):
        session.start(config={"telemetry": {"endpont": "x:1", "enabled": False}})
