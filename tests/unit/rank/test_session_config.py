"""What a rank tells the collector about its config: everything but the secrets."""

from __future__ import annotations

import json

from collector.rank.session import redacted


def test_secrets_are_redacted_and_the_rest_kept():
    config = {
        "telemetry": {"token": "s3cret", "endpoint": "h:1"},
        "wandb": {"api_key": "k", "project": "p"},
        "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
        "list": [{"password": "x"}],
        "telemetry_token_unset": None,
    }
    out = redacted(config)
    text = json.dumps(out)
    assert "s3cret" not in text and '"k"' not in text and '"x"' not in text
    assert out["telemetry"] == {"token": "<redacted>", "endpoint": "h:1"}
    assert out["optimizer"] == config["optimizer"] and out["wandb"]["project"] == "p"
    assert out["telemetry_token_unset"] is None  # nothing to hide: left as it is
