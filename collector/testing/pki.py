"""A throwaway CA and a server certificate for 127.0.0.1/localhost, made with the
openssl CLI when a test or benchmark runs (nothing secret is checked in), plus a
second CA that signed nothing, for the must-not-trust cases. EC P-256 keys, valid
for two days."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


class OpenSSLMissing(RuntimeError):
    """The openssl CLI is not on PATH; tests skip on it, benchmarks report it."""


@dataclass(frozen=True)
class TestPKI:
    __test__ = False  # a helper, not a pytest class to collect

    ca: Path  # the CA certificate clients trust
    cert: Path  # the server's certificate, signed by ca
    key: Path  # the server's private key
    other_ca: Path  # a CA that did not sign cert


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed: {proc.stderr.strip()}")


# openssl req's options for a fresh unencrypted P-256 key (the CAs' and the server's).
_NEW_EC_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


def _ca(d: Path, name: str) -> None:
    _openssl(
        "req",
        "-x509",
        *_NEW_EC_KEY,
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.pem",
        "-days",
        "2",
        "-subj",
        f"/CN={name}",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign",
        cwd=d,
    )


def make_pki(d: Path) -> TestPKI:
    """Write the CAs, the server's key and certificate into directory ``d`` (created if missing)."""
    if shutil.which("openssl") is None:
        raise OpenSSLMissing("the openssl CLI is needed to make a test CA")
    d = Path(d)
    d.mkdir(parents=True, exist_ok=True)
    _ca(d, "ca")
    _ca(d, "other-ca")
    _openssl(
        "req",
        *_NEW_EC_KEY,
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
        cwd=d,
    )
    (d / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n"
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "2",
        "-extfile",
        "server.ext",
        cwd=d,
    )
    return TestPKI(ca=d / "ca.pem", cert=d / "server.pem", key=d / "server.key", other_ca=d / "other-ca.pem")
