"""The checkpoint's layout logic without processes, at scale: fragments written by 1,024
ZeRO ranks cover every parameter exactly once and read back for any other layout; the
index's name order merges every rank's experts; the resumable sampler deals the same global
batches at any world size (1, 2, 4 and 1,024 ranks); zero_to_fp32 as users run it.

Split by tier: the pure-function tests are in tests/unit/trainer/test_checkpoint_layout.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from tests.unit.trainer.test_checkpoint_layout import _params
from trainer.checkpoint.fragments import FragmentSource, bucket_fragments, runs
from trainer.checkpoint.layout import CheckpointError, save_torch, shard_file
from trainer.checkpoint.save import build_index
from trainer.zero.partition import build_buckets

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_zero_to_fp32_as_a_command(tmp_path):
    import trainer
    from tests._engine_util import engine_config, make_model, train

    engine, *_ = trainer.initialize(model=make_model(), config=engine_config(stage=2, batch=8, gas=1))
    train(engine, steps=2, batch=8)
    engine.save_checkpoint(tmp_path / "ck")
    run = [sys.executable, "-m", "trainer.checkpoint.zero_to_fp32"]
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run(
        [*run, str(tmp_path / "ck"), str(tmp_path / "out")], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "assembled 6/6 parameters" in proc.stderr and "pytorch_model.bin: 6 tensors" in proc.stdout
    model = make_model(seed=4)
    model.load_state_dict(torch.load(tmp_path / "out" / "pytorch_model.bin", weights_only=True), strict=True)
    pairs = zip(model.state_dict().values(), engine.module.state_dict().values())
    assert all(torch.equal(a, b) for a, b in pairs)
    from trainer.checkpoint.zero_to_fp32 import load_state_dict_from_zero_checkpoint

    loaded = load_state_dict_from_zero_checkpoint(make_model(seed=8), tmp_path / "ck")
    pairs = zip(loaded.state_dict().values(), model.state_dict().values())
    assert all(torch.equal(a, b) for a, b in pairs)
    with pytest.raises(CheckpointError, match=r"the checkpoint holds 2\.weight, which the model does not have"):
        load_state_dict_from_zero_checkpoint(nn.Sequential(nn.Linear(16, 64)), tmp_path / "ck")
    proc = subprocess.run(
        [*run, str(tmp_path / "ck"), str(tmp_path / "w.pt"), "-t", "global_step2"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0 and (tmp_path / "w.pt").is_file()
    for args, message in (
        ([str(tmp_path / "nope"), str(tmp_path / "x")], "holds no checkpoint: no 'latest' file"),
        ([str(tmp_path / "ck"), str(tmp_path / "x"), "-t", "global_step9"], "global_step9 does not exist"),
    ):
        proc = subprocess.run([*run, *args], capture_output=True, text=True, env=env, timeout=120)
        assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def _write_layout(tag_dir: str, named, world: int, bucket_numel: int) -> None:
    """What ``world`` ZeRO ranks of one data-parallel group write: per rank, its shard of every bucket
    (master = the parameter values, one moment = 2x them, step 7), then the index."""
    names = {id(p): n for n, p in named}
    metas = []
    os.makedirs(os.path.join(tag_dir, "shards"), exist_ok=True)
    for rank in range(world):
        fragments = {}
        for b in build_buckets(named, group_index=0, bucket_numel=bucket_numel, num_shards=world, shard_index=rank):
            flat = b.flatten_params()
            shard = b.shard_of(flat)
            fragments.update(bucket_fragments(b, shard, {"exp_avg": 2 * shard}, 7, names, group_rank=rank))
        save_torch({"rank": rank, "fragments": fragments, "tensors": {}}, os.path.join(tag_dir, shard_file(rank)))
        metas.append(
            {
                "tp_rank": 0,
                "file": shard_file(rank),
                "state_keys": ["exp_avg"],
                "fragments": {n: (f["offset"], f["fp32"].numel()) for n, f in fragments.items()},
                "shapes": {n: (list(p.shape), "float32", 0) for n, p in named if n in fragments},
                "buffers": [],
                "frozen": [],
                "aliases": {},
                "order": [n for n, _ in named] if rank == 0 else [],
            }
        )
    mp_ranks, keys = build_index(metas, 1)
    assert keys == ["exp_avg"]
    with open(os.path.join(tag_dir, "index.json"), "w") as f:
        json.dump(mp_ranks, f)


def test_fragments_of_1024_ranks_cover_every_parameter_once_and_read_back_on_3(tmp_path):
    named = _params()
    total = sum(p.numel() for _, p in named)
    _write_layout(str(tmp_path), named, 1024, bucket_numel=600)
    params = json.load(open(tmp_path / "index.json"))[0]["parameters"]
    assert list(params) == [n for n, _ in named]  # module order, not bucket order
    assert sum(n for p in params.values() for _, _, n in p["fragments"]) == total
    assert len({f for p in params.values() for f, _, _ in p["fragments"]}) == 1000  # 2465 elements, 1024 shards of 3
    # another layout (3 ranks, other buckets) finds its shards' values through the fragments
    source = FragmentSource(str(tmp_path), params)
    for rank in range(3):
        for b in build_buckets(named, group_index=0, bucket_numel=900, num_shards=3, shard_index=rank):
            values, moment = torch.zeros(b.shard_numel), torch.zeros(b.shard_numel)
            want = b.shard_of(b.flatten_params())
            steps = set()
            for s, lo, hi in runs(b.slots, b.shard_start, b.shard_start + b.shard_numel):
                at = s.offset + lo - b.shard_start
                steps |= source.copy_into(
                    s.name, lo, hi, {"fp32": values[at : at + hi - lo], "exp_avg": moment[at : at + hi - lo]}
                )
            assert torch.equal(values, want) and torch.equal(moment, 2 * want) and steps == {7.0}
