"""A collector's settings, as one validated object: what ``rankscope collect`` builds from its
flags and hands to ``serve`` (collector.server.serve).

Each part is a ``ConfigBlock`` (collector.data.config), declared beside the code that reads it:
the store's (``StoreConfig``), compaction's and retention's (``CompactionConfig``), the limits on
a rank stream (``StreamLimits``, collector.server.limits); the /metrics endpoint and what rides on
its findings refresh (``MetricsSettings``) and who may connect (``SecuritySettings``) are declared
here. A bad value raises ``ConfigError`` naming its dotted key (``store.flush_interval: must be
<= 5 (got 10.0)``, ``streams.rows_per_s: must be > 0 (got 0.0)``); a bind the policy refuses
(collector.data.security.check_bind) or a token that cannot travel raises
``SecurityConfigError``. Both are ValueErrors, as is ``SettingsError``, raised by ``serve`` for a
setting that passed these checks but cannot take effect: the caller's fault, not the machine's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from collector.data import layout
from collector.data.config import ConfigBlock, ConfigError
from collector.data.security import ServerTLS, check_bind, check_token
from collector.server.compaction import CompactionConfig
from collector.server.limits import StreamLimits
from collector.server.store import StoreConfig


class SettingsError(ValueError):
    """A setting that cannot take effect (a taken --metrics-port, a webhook URL that is not
    http(s), prometheus_client missing): the settings' fault, like a ConfigError."""


@dataclass(kw_only=True)
class MetricsSettings(ConfigBlock):
    SECTION: ClassVar[str] = "metrics"
    port: int | None = None  # serve Prometheus /metrics on the collector's host; None: no endpoint
    # runs exported; None: collector.server.metrics.MAX_RUNS (the endpoint checks the value: its
    # module pulls in pandas, which a collector without /metrics never loads)
    max_runs: int | None = None
    alert_webhook: str | None = None  # post each new finding here (collector.server.alerts)
    auto_profile: bool = True  # ask the ranks a new live finding names for evidence (server.escalation)
    auto_probe: bool = False  # time the links a slow-link finding leaves in doubt (server.probe)


@dataclass(kw_only=True)
class SecuritySettings(ConfigBlock):
    SECTION: ClassVar[str] = "security"
    token: str | None = None  # every RPC (and /metrics) must bear it
    tls: ServerTLS | None = None  # speak TLS only; the files are read when the collector starts
    insecure: bool = False  # a non-loopback host without a token, on purpose

    def validate(self) -> None:
        check_token(self.token)


@dataclass(kw_only=True)
class CollectorSettings(ConfigBlock):
    data_dir: str | Path
    host: str = "127.0.0.1"
    port: int = 50051  # 0 picks a free one
    writer: str | None = None  # this collector's id when several share data_dir (docs/SCALING.md)
    store: StoreConfig = field(default_factory=StoreConfig)
    compaction: CompactionConfig = field(default_factory=CompactionConfig)
    streams: StreamLimits = field(default_factory=StreamLimits)
    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    security: SecuritySettings = field(default_factory=SecuritySettings)

    def validate(self) -> None:
        layout.check_writer(self.writer)
        if self.compaction.raw_every and self.writer:
            raise ConfigError(
                "--raw-every needs every rank of a run in one collector (its rollup compares "
                "ranks); it cannot be combined with --writer-id"
            )
        self.bind_warnings()  # raises when the bind policy refuses the host

    def bind_warnings(self) -> list[str]:
        """What to tell the operator before listening (an open or clear-text wide bind)."""
        return check_bind(
            self.host, token=self.security.token, tls=self.security.tls is not None, insecure=self.security.insecure
        )

    @property
    def address(self) -> str:
        """``host:port`` as gRPC binds it (an IPv6 host in brackets)."""
        host = self.host
        return f"[{host}]:{self.port}" if ":" in host and not host.startswith("[") else f"{host}:{self.port}"
