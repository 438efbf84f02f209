"""native.AsyncIOHandle: bit-exact round trips, offsets, async ops, errors.

Runs on whichever backend native.aio.BACKEND reports; tests/integration/native/test_fallback.py
re-runs this file with RANKSCOPE_NATIVE=off to cover the Python fallback.
tmp_path lives on the root filesystem (ext4 here), where O_DIRECT applies to
aligned requests; the tmpfs tests cover filesystems that refuse O_DIRECT.


Split by tier: the pure-function tests are in tests/unit/native/test_aio.py."""

import errno
import os
import subprocess

import pytest
import torch

from native import AsyncIOHandle
from tests.unit.native.test_aio import MiB, _random_bytes


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A 1 MiB tmpfs (needs root and mount permission), else None."""
    mount_point = tmp_path / "tiny"
    mount_point.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount_point)], capture_output=True, timeout=30
    )
    if result.returncode != 0:
        yield None
        return
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], timeout=30)


def test_full_disk_is_a_clear_error(tiny_tmpfs):
    handle = AsyncIOHandle(intra_op_parallelism=2)
    data = _random_bytes(4 * MiB)
    if tiny_tmpfs is not None:
        target = tiny_tmpfs / "overflow.bin"
    elif os.path.exists("/dev/full"):
        target = "/dev/full"  # every write fails with ENOSPC
    else:
        pytest.skip("cannot mount a tiny tmpfs and there is no /dev/full to simulate a full disk")
    with pytest.raises(OSError, match="No space left on device") as info:
        handle.sync_pwrite(data, target)
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(target)
    handle.async_pwrite(data, target)
    with pytest.raises(OSError, match="No space left on device"):
        handle.wait()


def test_round_trip_on_tmpfs_without_o_direct(tiny_tmpfs):
    if tiny_tmpfs is None and not os.path.isdir("/dev/shm"):
        pytest.skip("no tmpfs available (cannot mount one, no /dev/shm)")
    directory = tiny_tmpfs if tiny_tmpfs is not None else "/dev/shm"
    handle = AsyncIOHandle(block_size=64 * 1024)
    source = handle.new_cpu_locked_tensor(512 * 1024, torch.empty(0, dtype=torch.uint8))
    source.copy_(_random_bytes(source.numel()))
    path = os.path.join(directory, f"rankscope-aio-{os.getpid()}.bin")
    try:
        handle.sync_pwrite(source, path)
        target = torch.empty_like(source)
        handle.sync_pread(target, path)
        assert torch.equal(target, source)
    finally:
        os.unlink(path)
