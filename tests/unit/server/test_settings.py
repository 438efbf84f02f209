"""The collector's settings object (collector.server.settings) and serve(): a bad setting is refused
by name before anything is created; serve runs a real collector until told to stop, tells its
caller where it listens, and raises (never prints, never returns an exit code) when it cannot start.

Split by tier: what needs processes, sockets or seconds is in tests/integration/server/test_settings.py."""

import pytest

from collector.data.config import ConfigError
from collector.data.security import SecurityConfigError
from collector.server.compaction import CompactionConfig
from collector.server.limits import StreamLimits
from collector.server.settings import CollectorSettings, SecuritySettings
from collector.server.store import StoreConfig


def test_a_bad_setting_is_named_by_its_dotted_key(tmp_path):
    with pytest.raises(ConfigError, match=r"^streams\.rows_per_s: must be > 0 \(got 0\.0\)$"):
        CollectorSettings(data_dir=tmp_path, streams=StreamLimits(rows_per_s=0.0))
    with pytest.raises(ConfigError, match=r"^store\.flush_interval: must be <= 5 \(got 10\.0\)$"):
        CollectorSettings(data_dir=tmp_path, store=StoreConfig(flush_interval=10.0))
    with pytest.raises(ConfigError, match=r"^port: must be an integer \(got '50051'\)$"):
        CollectorSettings(data_dir=tmp_path, port="50051")
    with pytest.raises(ConfigError, match=r"--raw-every .* --writer-id"):
        CollectorSettings(data_dir=tmp_path, writer="east", compaction=CompactionConfig(raw_every=10))
    with pytest.raises(ValueError, match="writer id 'East' is not allowed"):
        CollectorSettings(data_dir=tmp_path, writer="East")
    with pytest.raises(SecurityConfigError, match="token must be printable ASCII"):
        SecuritySettings(token="two words")
    assert not any(tmp_path.iterdir())  # refused before anything was created


def test_the_bind_policy_is_part_of_the_settings(tmp_path):
    with pytest.raises(SecurityConfigError, match=r"refusing to listen on 0\.0\.0\.0 without a token"):
        CollectorSettings(data_dir=tmp_path, host="0.0.0.0")
    wide_open = CollectorSettings(data_dir=tmp_path, host="0.0.0.0", security=SecuritySettings(insecure=True))
    assert any("no token" in w for w in wide_open.bind_warnings())
    assert CollectorSettings(data_dir=tmp_path).bind_warnings() == []
    assert CollectorSettings(data_dir=tmp_path, host="::1", port=7).address == "[::1]:7"
