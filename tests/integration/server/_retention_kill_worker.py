"""Run one retention pass over a prepared data dir and stop dead at a chosen point, to be
SIGKILLed there by tests/integration/server/test_retention_kill.py:

    python -m tests.integration.server._retention_kill_worker DATA_DIR RUN_ID POINT

POINT ``outputs-written``: the split outputs are written (fsync'd, temporary names), the ledger
record not yet; ``mid-apply``: the record is committed, the inputs unlinked and the first output
renamed into place, the second not yet. The worker prints ``ready`` there and waits to be killed."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from collector.data import layout
from collector.server.compaction import CompactionConfig
from collector.server.ledger import Ledger
from collector.server.retention import Retention


def _stop_here() -> None:
    print("ready", flush=True)
    time.sleep(600)


def main(data_dir: str, run_id: str, point: str) -> None:
    ledger = Ledger(Path(data_dir))
    if point == "outputs-written":
        ledger.commit_compaction = lambda *args: _stop_here()
    else:
        real_replace = os.replace

        def replace(src, dst):  # the ledger's renames into place; a comm output is the stop
            real_replace(src, dst)
            dst = Path(dst)
            if dst.parent.parent.name == "comm" and dst.name.startswith("cmp-") and dst.suffix == ".parquet":
                _stop_here()

        os.replace = replace
    retention = Retention(Path(data_dir), ledger, CompactionConfig(raw_every=5, retention_window=10))
    retention.run(layout.partition_dir(Path(data_dir), "comm", run_id))
    print("finished without stopping", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
