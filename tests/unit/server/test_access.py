"""Who may talk to a collector: bearer token on both RPCs (checked before anything
is decoded), TLS (a plaintext client gets nothing), and the bind policy of
``rankscope collect`` (loopback by default; a wider address needs a token or
``--insecure``, which warns).

Split by tier: what needs processes, sockets or seconds is in tests/integration/server/test_access.py."""

from __future__ import annotations

import pytest

from collector.data import security

TOKEN = "t0ken-for-tests"


# -- bind policy ----------------------------------------------------------------


@pytest.mark.parametrize(
    "host, loopback",
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.5", False),
        ("collector.example", False),
    ],
)
def test_loopback_detection(host, loopback):
    assert security.is_loopback(host) is loopback


def test_bind_policy():
    assert security.check_bind("127.0.0.1", token=None, tls=False) == []
    with pytest.raises(security.SecurityConfigError, match="--insecure"):
        security.check_bind("0.0.0.0", token=None, tls=False)
    open_warnings = security.check_bind("0.0.0.0", token=None, tls=False, insecure=True)
    assert any("no token" in w for w in open_warnings) and any("without TLS" in w for w in open_warnings)
    assert security.check_bind("0.0.0.0", token=TOKEN, tls=True) == []
    assert [w for w in security.check_bind("0.0.0.0", token=TOKEN, tls=False) if "clear text" in w]
