"""Who may talk to a collector: bind policy, bearer tokens and TLS, for both sides.

The collector listens on 127.0.0.1 unless told otherwise. Anything wider is a
network service that accepts telemetry -- and writes files -- for whoever
connects, so the rules are:

- loopback (127.0.0.0/8, ::1, ``localhost``): no token needed;
- any other address: a bearer token is required (``--token`` /
  ``RANKSCOPE_TOKEN``), or ``--insecure`` to run open on purpose, which prints a
  warning; a token without TLS also warns, since it then crosses the network in
  clear text.

A token is checked on every RPC, before the request is decoded, in constant
time (collector.server.auth.BearerTokenInterceptor). TLS: the collector takes a PEM
certificate chain and key (``--tls-cert`` / ``--tls-key``); clients take the CA
that signed it (``--tls-ca`` / ``RANKSCOPE_TLS_CA`` / ``tls_ca=``). With TLS on,
a plaintext client gets nothing but a failed handshake (UNAVAILABLE).

Everything that opens a channel to a collector goes through ``open_channel``,
so token and TLS handling live in one place.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

TOKEN_ENV = "RANKSCOPE_TOKEN"
TLS_CA_ENV = "RANKSCOPE_TLS_CA"
AUTH_KEY = "authorization"


class SecurityConfigError(ValueError):
    """A bind/token/TLS setting that cannot work; the message says which and why."""


# -- tokens ------------------------------------------------------------------------


def resolve_token(token: str | None = None) -> str | None:
    """The argument, else ``$RANKSCOPE_TOKEN``, else None (empty strings count as unset)."""
    return token or os.environ.get(TOKEN_ENV) or None


def check_token(token: str | None) -> str | None:
    """``token`` if it can travel as gRPC metadata (printable ASCII, no spaces)."""
    if token is None:
        return None
    if not token.isascii() or not token.isprintable() or " " in token:
        raise SecurityConfigError(
            "token must be printable ASCII without spaces "
            "(e.g. python -c 'import secrets; print(secrets.token_urlsafe())')"
        )
    return token


def auth_metadata(token: str | None) -> list[tuple[str, str]] | None:
    """Call metadata carrying ``token``, or None without one."""
    return [(AUTH_KEY, f"Bearer {token}")] if token else None


# -- bind policy ------------------------------------------------------------------


def is_loopback(host: str) -> bool:
    host = host.strip().strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve to anything


def check_bind(host: str, *, token: str | None, tls: bool, insecure: bool = False) -> list[str]:
    """Warnings to print before listening on ``host``; raises SecurityConfigError
    when a non-loopback address would be open to anyone without ``insecure``."""
    if is_loopback(host):
        return []
    if token is None and not insecure:
        raise SecurityConfigError(
            f"refusing to listen on {host} without a token: anyone who can reach it could write into "
            f"the data dir. Pass --token (or set {TOKEN_ENV}), ideally with --tls-cert/--tls-key, "
            "or --insecure to run open on purpose"
        )
    warnings = []
    if token is None:
        warnings.append(
            f"WARNING: listening on {host} with no token (--insecure): anyone who can reach "
            "this port can send telemetry into the data dir"
        )
    if not tls:
        warnings.append(
            f"WARNING: listening on {host} without TLS: "
            + ("the bearer token and " if token else "")
            + "all telemetry cross the network in clear text (add --tls-cert/--tls-key)"
        )
    return warnings


# -- TLS --------------------------------------------------------------------------


def _read_pem(path, what: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise SecurityConfigError(f"{what} {str(path)!r}: {exc.strerror or exc}") from None
    if b"-----BEGIN " not in data:
        raise SecurityConfigError(f"{what} {str(path)!r} is not a PEM file")
    return data


@dataclass(frozen=True, kw_only=True)
class ServerTLS:
    """The collector's certificate chain and private key (PEM files)."""

    cert: Path
    key: Path

    @classmethod
    def from_args(cls, cert, key) -> ServerTLS | None:
        if not cert and not key:
            return None
        if not (cert and key):
            raise SecurityConfigError("TLS needs both --tls-cert and --tls-key")
        return cls(cert=Path(cert), key=Path(key))

    def credentials(self) -> grpc.ServerCredentials:
        key = _read_pem(self.key, "TLS key")
        cert = _read_pem(self.cert, "TLS certificate")
        if b"PRIVATE KEY-----" not in key:
            raise SecurityConfigError(f"TLS key {str(self.key)!r} holds no private key")
        return grpc.ssl_server_credentials([(key, cert)])


def resolve_tls_ca(tls_ca=None) -> str | None:
    """The argument, else ``$RANKSCOPE_TLS_CA``, else None (plaintext)."""
    value = tls_ca or os.environ.get(TLS_CA_ENV) or None
    return str(value) if value else None


def channel_options(extra: Sequence[tuple[str, object]] = ()) -> list[tuple[str, object]]:
    return [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20), *extra]


def open_channel(
    endpoint: str, *, tls_ca=None, options: Sequence[tuple[str, object]] | None = None, server_name: str | None = None
) -> grpc.Channel:
    """A channel to ``endpoint``: TLS verified against the CA file ``tls_ca`` when
    given (``server_name`` overrides the name checked in the certificate), else
    plaintext. Raises SecurityConfigError for an unreadable CA file."""
    opts = list(channel_options() if options is None else options)
    if not tls_ca:
        return grpc.insecure_channel(endpoint, options=opts)
    creds = grpc.ssl_channel_credentials(root_certificates=_read_pem(tls_ca, "TLS CA"))
    if server_name:
        opts.append(("grpc.ssl_target_name_override", server_name))
    return grpc.secure_channel(endpoint, creds, options=opts)
