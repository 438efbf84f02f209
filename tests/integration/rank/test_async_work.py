"""Async collectives whose gloo Work has no future (reduce_scatter_tensor in torch 2.13):
they are timed at the caller's wait(), and nothing else waits on them. A second wait
from another thread re-copies gloo's result into the output and silently undid the
caller's in-place edits (ZeRO-1 divides its shard right after wait())."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from collector.testing.gloo import run_ranks

S = 1000


def _worker(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    from collector.rank import comm

    comm.configure({"enabled": True, "prof_all": True})
    flat = torch.full((2 * S,), float(rank + 1))
    shard = flat[rank * S : (rank + 1) * S]
    work = comm.reduce_scatter_tensor(shard, flat, async_op=True, log_name="rs_inplace")
    work.wait()
    shard.div_(2)  # what ZeRO-1 does to its shard right after the wait
    time.sleep(0.3)  # room for any other thread to touch the output
    summary = comm.log_summary(return_dict=True)
    Path(out, f"rank{rank}.json").write_text(
        json.dumps(
            {
                "shard": sorted(set(shard.tolist())),
                "completed": work.is_completed(),
                "is_work": isinstance(work, dist.Work),
                "recorded": sum(v["count"] for v in summary.get("rs_inplace", {}).values()),
            }
        )
    )
    dist.destroy_process_group()


def test_future_less_work_keeps_the_callers_output_and_is_recorded(tmp_path):
    run_ranks(_worker, 2, str(tmp_path))
    for rank in range(2):
        seen = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert seen["shard"] == [1.5]  # (1 + 2) / 2, untouched after the caller's div_
        assert seen["completed"] and seen["is_work"]
        assert seen["recorded"] == 1
