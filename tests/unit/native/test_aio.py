"""native.AsyncIOHandle: bit-exact round trips, offsets, async ops, errors.

Runs on whichever backend native.aio.BACKEND reports; tests/integration/native/test_fallback.py
re-runs this file with RANKSCOPE_NATIVE=off to cover the Python fallback.
tmp_path lives on the root filesystem (ext4 here), where O_DIRECT applies to
aligned requests; the tmpfs tests cover filesystems that refuse O_DIRECT.


Split by tier: what needs processes, sockets or seconds is in tests/integration/native/test_aio.py."""

import os

import pytest
import torch

from native import AsyncIOHandle, aio

MiB = 1 << 20


def _random_bytes(n, seed=0):
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def _unaligned(n):
    """A CPU tensor of n bytes whose data pointer is deliberately not 4 KiB aligned."""
    return torch.empty(n + 1, dtype=torch.uint8)[1:]


@pytest.mark.parametrize("size", [1, 511, 4096, 4097, MiB - 3, MiB, 3 * MiB + 17])
@pytest.mark.parametrize("aligned", [True, False])
@pytest.mark.parametrize("file_offset", [0, 4096, 13])
def test_sync_round_trip_is_bit_exact(tmp_path, size, aligned, file_offset):
    handle = AsyncIOHandle(block_size=256 * 1024, queue_depth=4, intra_op_parallelism=3)
    source = handle.new_cpu_locked_tensor(size, torch.empty(0, dtype=torch.uint8)) if aligned else _unaligned(size)
    source.copy_(_random_bytes(size, seed=size))
    path = tmp_path / "blob.bin"
    assert handle.sync_pwrite(source, str(path), file_offset=file_offset) == 1
    assert os.path.getsize(path) == file_offset + size
    assert path.read_bytes()[file_offset:] == source.numpy().tobytes()

    target = handle.new_cpu_locked_tensor(size, source) if aligned else _unaligned(size)
    target.zero_()
    assert handle.sync_pread(target, path, file_offset=file_offset) == 1
    assert torch.equal(target, source)


@pytest.mark.parametrize("single_submit", [True, False])
@pytest.mark.parametrize("overlap_events", [True, False])
def test_async_ops_in_flight_together(tmp_path, single_submit, overlap_events):
    handle = AsyncIOHandle(
        block_size=64 * 1024,
        queue_depth=8,
        single_submit=single_submit,
        overlap_events=overlap_events,
        intra_op_parallelism=2,
    )
    # Mixed dtypes and shapes: the handle moves the raw bytes of any tensor.
    sources = [_random_bytes(1 + i * 700_001, seed=i).view(torch.uint8) for i in range(5)]
    sources += [torch.randn(257, 33), torch.randn(1000, dtype=torch.float64).to(torch.bfloat16)]
    paths = [tmp_path / f"t{i}.bin" for i in range(len(sources))]
    for t, p in zip(sources, paths):
        assert handle.async_pwrite(t, p) == 0
    assert handle.wait() == len(sources)
    targets = [torch.empty_like(t) for t in sources]
    for t, p in zip(targets, paths):
        handle.async_pread(t, p)
    assert handle.wait() == len(sources)
    for source, target in zip(sources, targets):
        assert torch.equal(source.view(-1).view(torch.uint8), target.view(-1).view(torch.uint8))
    assert handle.wait() == 0


def test_writes_at_offsets_compose_into_one_file(tmp_path):
    handle = AsyncIOHandle(block_size=4096, intra_op_parallelism=2)
    whole = _random_bytes(3 * 4096 + 100)
    path = tmp_path / "pieces.bin"
    # Out of order, unaligned boundaries, async together.
    handle.async_pwrite(whole[5000:], path, file_offset=5000)
    handle.async_pwrite(whole[:5000].clone(), path, file_offset=0)
    assert handle.wait() == 2
    back = torch.empty_like(whole)
    handle.pread(back, path)
    assert torch.equal(back, whole)
    middle = torch.empty(777, dtype=torch.uint8)
    handle.read(middle[:0], path)  # zero bytes is a no-op, not an error
    handle.sync_pread(middle, path, file_offset=4000)
    assert torch.equal(middle, whole[4000:4777])


def test_256MiB_round_trip_async(tmp_path):
    size = 256 * MiB
    handle = AsyncIOHandle(intra_op_parallelism=2)
    source = handle.new_cpu_locked_tensor(size, torch.empty(0, dtype=torch.uint8))
    source.copy_(_random_bytes(size))
    path = tmp_path / "big.bin"
    handle.async_pwrite(source, path)
    assert handle.wait() == 1
    target = handle.new_cpu_locked_tensor(size, source)
    handle.async_pread(target, path)
    assert handle.wait() == 1
    assert torch.equal(target, source)
    assert handle.free_cpu_locked_tensor(target) and handle.free_cpu_locked_tensor(source)


def test_validate_checks_against_a_plain_read(tmp_path):
    handle = AsyncIOHandle()
    data = _random_bytes(10_000)
    path = tmp_path / "v.bin"
    assert handle.write(data, path, validate=True) == 1
    back = torch.empty_like(data)
    handle.pread(back, path, validate=True, async_op=True)
    assert handle.wait() == 1 and torch.equal(back, data)


def test_missing_file_is_a_clear_error_sync_and_async(tmp_path):
    handle = AsyncIOHandle()
    missing = tmp_path / "nope" / "x.bin"
    with pytest.raises(FileNotFoundError, match="pread") as info:
        handle.sync_pread(torch.empty(10, dtype=torch.uint8), missing)
    assert info.value.filename == str(missing)
    with pytest.raises(FileNotFoundError) as info:
        handle.sync_pwrite(torch.empty(10, dtype=torch.uint8), missing)
    assert info.value.filename == str(missing)

    ok = tmp_path / "ok.bin"
    handle.async_pwrite(torch.ones(10, dtype=torch.uint8), ok)
    handle.async_pread(torch.empty(10, dtype=torch.uint8), missing)
    with pytest.raises(FileNotFoundError, match="No such file"):
        handle.wait()
    assert ok.read_bytes() == b"\x01" * 10  # the good op in the same batch still completed
    assert handle.wait() == 0  # errors are reported once


def test_directory_and_short_read_are_clear_errors(tmp_path):
    handle = AsyncIOHandle()
    with pytest.raises(IsADirectoryError) as info:
        handle.sync_pwrite(torch.ones(4, dtype=torch.uint8), tmp_path)
    assert info.value.filename == str(tmp_path)
    path = tmp_path / "short.bin"
    path.write_bytes(b"x" * 100)
    with pytest.raises(EOFError, match=f"{path}.*100 bytes.*200 bytes"):
        handle.sync_pread(torch.empty(200, dtype=torch.uint8), path)
    handle.async_pread(torch.empty(10, dtype=torch.uint8), path, file_offset=95)
    with pytest.raises(EOFError, match="offset 95"):
        handle.wait()


def test_settings_and_bad_arguments():
    handle = AsyncIOHandle(
        block_size=8192, queue_depth=4, single_submit=True, overlap_events=True, intra_op_parallelism=3
    )
    assert handle.get_block_size() == 8192
    assert handle.get_queue_depth() == 4
    assert handle.get_single_submit() is True
    assert handle.get_overlap_events() is True
    assert handle.get_intra_op_parallelism() == 3
    defaults = AsyncIOHandle()
    assert (
        defaults.get_block_size(),
        defaults.get_queue_depth(),
        defaults.get_single_submit(),
        defaults.get_overlap_events(),
        defaults.get_intra_op_parallelism(),
    ) == (1048576, 128, False, False, 1)
    for bad in (dict(block_size=0), dict(queue_depth=-1), dict(intra_op_parallelism=0), dict(block_size=1.5)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            AsyncIOHandle(**bad)
    with pytest.raises(ValueError, match="contiguous"):
        handle.sync_pwrite(torch.zeros(4, 4).t(), "/tmp/never-written.bin")
    with pytest.raises(TypeError, match=r"torch\.Tensor"):
        handle.sync_pwrite(b"bytes", "/tmp/never-written.bin")
    with pytest.raises(ValueError, match="file_offset"):
        handle.sync_pread(torch.zeros(4), "/tmp/never-read.bin", file_offset=-1)
    assert not os.path.exists("/tmp/never-written.bin")


def test_locked_tensor_is_page_aligned_with_example_dtype():
    handle = AsyncIOHandle()
    t = handle.new_cpu_locked_tensor(1000, torch.empty(0, dtype=torch.float16))
    assert t.dtype == torch.float16 and t.shape == (1000,)
    if aio.BACKEND == "native":
        assert t.data_ptr() % 4096 == 0
    t.fill_(1.5)
    assert handle.free_cpu_locked_tensor(t) is True
    assert float(t.sum()) == 1500.0  # still valid while referenced


def test_large_locked_tensors_start_on_a_huge_page_boundary_and_round_trip(tmp_path):
    """From 2 MiB up, buffers are mapped on their own on a 2 MiB boundary (transparent huge pages:
    much faster O_DIRECT reads on a virtual disk); views keep the mapping alive."""
    handle = AsyncIOHandle()
    for n in (2 * MiB, 3 * MiB + 5):
        t = handle.new_cpu_locked_tensor(n, torch.empty(0, dtype=torch.uint8))
        if aio.BACKEND == "native":
            assert t.data_ptr() % (2 * MiB) == 0
        t.copy_(_random_bytes(n))
        handle.sync_pwrite(t, tmp_path / "h.bin")
        back = handle.new_cpu_locked_tensor(n, t)
        handle.sync_pread(back, tmp_path / "h.bin")
        assert torch.equal(back, t)
        view = back[7:]
        assert handle.free_cpu_locked_tensor(back)
        del back
        assert view.numel() == n - 7 and int(view[-1]) == int(t[-1])


def test_tickets_wait_for_one_op_and_leave_the_others_running(tmp_path):
    handle = AsyncIOHandle(intra_op_parallelism=2)
    data = [_random_bytes(200_000 + i) for i in range(3)]
    paths = [tmp_path / f"t{i}.bin" for i in range(3)]
    writes = [handle.submit(d, p, is_read=False) for d, p in zip(data, paths)]
    handle.wait_ops(writes)
    assert all(handle.is_done(t) for t in writes) and handle.wait() == 0  # collected by wait_ops
    back = [torch.empty_like(d) for d in data]
    reads = [handle.submit(b, p, is_read=True, validate=True) for b, p in zip(back, paths)]
    handle.wait_ops([reads[1]])
    assert torch.equal(back[1], data[1]) and handle.is_done(reads[1])
    assert handle.wait() == 2  # the other two, still collected by wait()
    assert all(torch.equal(b, d) for b, d in zip(back, data))
    bad = handle.submit(torch.empty(10, dtype=torch.uint8), tmp_path / "missing.bin", is_read=True)
    good = handle.submit(torch.empty(10, dtype=torch.uint8), paths[0], is_read=True)
    handle.wait_ops([good])  # the failed op is not among these: no error here
    with pytest.raises(FileNotFoundError, match="No such file"):
        handle.wait_ops([bad])
    assert handle.wait() == 0
