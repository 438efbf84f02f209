"""collector.testing.pki: the server certificate verifies against its CA (for
127.0.0.1 and localhost) and not against the other CA."""

from __future__ import annotations

import subprocess

import pytest

from collector.testing.pki import OpenSSLMissing, make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    try:
        return make_pki(tmp_path_factory.mktemp("pki") / "made-here")
    except OpenSSLMissing as exc:
        pytest.skip(str(exc))


def _verify(ca, cert, *extra) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["openssl", "verify", "-CAfile", str(ca), *extra, str(cert)], capture_output=True, text=True, timeout=60
    )


def test_the_server_certificate_is_signed_by_the_ca_for_loopback(pki):
    assert _verify(pki.ca, pki.cert).returncode == 0
    assert _verify(pki.ca, pki.cert, "-verify_ip", "127.0.0.1").returncode == 0
    assert _verify(pki.ca, pki.cert, "-verify_hostname", "localhost").returncode == 0
    assert _verify(pki.ca, pki.cert, "-verify_hostname", "example.org").returncode != 0


def test_the_other_ca_did_not_sign_it(pki):
    assert _verify(pki.other_ca, pki.cert).returncode != 0
    assert pki.key.read_text().startswith("-----BEGIN PRIVATE KEY-----")
