"""native.swap.TensorSwapper: round trips through files, prefetch, overwrite, cleanup."""

import os

import pytest
import torch

from native.aio import AsyncIOHandle
from native.swap import TensorSwapper


def test_round_trip_of_mixed_tensors_with_prefetch(tmp_path):
    tensors = {
        "layer0.weight": torch.randn(300, 17),
        "layer0.exp_avg": torch.randn(5000, dtype=torch.float64),
        "embed/bf16": torch.randn(4096).to(torch.bfloat16),
        "scalar": torch.tensor(3.5),
        "empty": torch.empty(0, 4),
    }
    with TensorSwapper(str(tmp_path), AsyncIOHandle(intra_op_parallelism=2)) as swapper:
        for key, t in tensors.items():
            swapper.swap_out(key, t)
        originals = {k: v.clone() for k, v in tensors.items()}
        for t in tensors.values():
            t.zero_()  # the caller's tensors are free for reuse once swap_out returns
        swapper.prefetch("layer0.weight")
        swapper.prefetch("embed/bf16")
        for key, expected in originals.items():
            back = swapper.swap_in(key)
            assert back.shape == expected.shape and back.dtype == expected.dtype
            assert torch.equal(back, expected), key
        assert len(os.listdir(swapper.directory)) == len(tensors)
        directory = swapper.directory
    assert not os.path.exists(directory)
    assert os.listdir(tmp_path) == []


def test_swap_out_again_overwrites_and_swap_in_is_repeatable(tmp_path):
    swapper = TensorSwapper(str(tmp_path))
    swapper.swap_out("m", torch.arange(10.0))
    swapper.swap_out("m", torch.arange(10.0) * 2)  # the first write is still in flight
    assert torch.equal(swapper.swap_in("m"), torch.arange(10.0) * 2)
    assert torch.equal(swapper.swap_in("m"), torch.arange(10.0) * 2)
    assert swapper.keys() == ["m"]
    assert len(os.listdir(swapper.directory)) == 1
    swapper.close()
    assert os.listdir(tmp_path) == []


def test_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        TensorSwapper(str(tmp_path / "missing"))
    with TensorSwapper(str(tmp_path)) as swapper:
        with pytest.raises(KeyError, match="nothing swapped out under key 'nope'"):
            swapper.swap_in("nope")
        swapper.swap_out("x", torch.ones(3))
        swapper.synchronize()
        (swap_file,) = os.listdir(swapper.directory)
        os.unlink(os.path.join(swapper.directory, swap_file))  # lost behind our back
        with pytest.raises(FileNotFoundError) as info:
            swapper.swap_in("x")
        assert info.value.filename == os.path.join(swapper.directory, swap_file)


def test_swap_in_waits_for_its_own_read_only(tmp_path):
    """A prefetched key is handed out once its own read is done; ready() says so without waiting,
    and keys whose reads are still queued are not waited for."""
    handle = AsyncIOHandle(intra_op_parallelism=1)
    with TensorSwapper(str(tmp_path), handle) as swapper:
        tensors = {f"k{i}": torch.randn(300_000 + i) for i in range(4)}
        for k, t in tensors.items():
            swapper.swap_out(k, t)
        swapper.synchronize()
        for k in tensors:
            swapper.prefetch(k)
        first = swapper.swap_in("k0")
        assert torch.equal(first, tensors["k0"])
        assert handle.pending() == 3  # the other reads were not waited for (done or not)
        swapper.synchronize()
        assert handle.pending() == 0
        assert all(swapper.ready(k) for k in ("k1", "k2", "k3"))
        assert all(torch.equal(swapper.swap_in(k), tensors[k]) for k in ("k1", "k2", "k3"))
