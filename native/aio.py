"""AsyncIOHandle: tensors to and from files, blocking or not (DeepSpeed's aio_handle API).

    h = AsyncIOHandle(intra_op_parallelism=4)
    h.async_pwrite(t, "/nvme/t.bin")      # returns at once
    ...                                    # compute while the write runs
    h.wait()                               # -> 1 (ops completed); raises on failure

How the knobs map onto the engine (native/csrc/aio.cpp, a thread pool of
`intra_op_parallelism` workers issuing pread/pwrite, O_DIRECT when aligned):
  block_size      bytes per request.
  queue_depth     requests a worker submits together (one pread/pwrite of
                  block_size * queue_depth bytes), unless single_submit.
  single_submit   submit one block_size request at a time.
  overlap_events  workers claim work from a shared cursor as they finish,
                  instead of each taking a fixed 1/N slice of the op.
Writes create the file and never truncate it, so writes at offsets compose.
Failures surface as OSError (errno, strerror, the file name) or EOFError for
a short read: immediately for sync ops, at wait() for async ones.

Beyond DeepSpeed's API, ``submit`` starts one op and returns a ticket;
``wait_ops(tickets)`` waits for those ops only and ``is_done(ticket)`` polls one,
so a caller can use the first of several reads in flight while the others run
(native.swap does, to pipeline ZeRO-3 parameter reads).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Union

import torch

from native import build

PathLike = Union[str, "os.PathLike[str]"]
_kernel = build.load("aio")

#: "native" when the C++ engine is in use, "python" for the thread-pool fallback.
BACKEND = "native" if _kernel is not None else "python"


class AsyncIOHandle:
    """Reads/writes whole CPU tensors from/to files, optionally asynchronously."""

    def __init__(
        self,
        block_size: int = 1048576,
        queue_depth: int = 128,
        single_submit: bool = False,
        overlap_events: bool = False,
        intra_op_parallelism: int = 1,
    ):
        for name, value in (
            ("block_size", block_size),
            ("queue_depth", queue_depth),
            ("intra_op_parallelism", intra_op_parallelism),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"AsyncIOHandle: {name} must be a positive int, got {value!r}")
        engine_class = _kernel.AioHandle if _kernel is not None else _PythonEngine
        self._engine = engine_class(
            block_size, queue_depth, bool(single_submit), bool(overlap_events), intra_op_parallelism
        )
        self._async_validations: dict[int, tuple[bool, torch.Tensor, str, int]] = {}  # by ticket

    # -- I/O ------------------------------------------------------------------
    def pread(
        self,
        buffer: torch.Tensor,
        filename: PathLike,
        validate: bool = False,
        async_op: bool = False,
        file_offset: int = 0,
    ) -> int:
        """Fill `buffer` from `filename` at `file_offset`. Returns 1 when done, 0 if queued."""
        return self._io(True, buffer, filename, validate, async_op, file_offset)

    def pwrite(
        self,
        buffer: torch.Tensor,
        filename: PathLike,
        validate: bool = False,
        async_op: bool = False,
        file_offset: int = 0,
    ) -> int:
        """Write `buffer` into `filename` at `file_offset`. Returns 1 when done, 0 if queued."""
        return self._io(False, buffer, filename, validate, async_op, file_offset)

    def sync_pread(self, buffer: torch.Tensor, filename: PathLike, file_offset: int = 0) -> int:
        return self.pread(buffer, filename, False, False, file_offset)

    def sync_pwrite(self, buffer: torch.Tensor, filename: PathLike, file_offset: int = 0) -> int:
        return self.pwrite(buffer, filename, False, False, file_offset)

    def async_pread(self, buffer: torch.Tensor, filename: PathLike, file_offset: int = 0) -> int:
        return self.pread(buffer, filename, False, True, file_offset)

    def async_pwrite(self, buffer: torch.Tensor, filename: PathLike, file_offset: int = 0) -> int:
        return self.pwrite(buffer, filename, False, True, file_offset)

    def read(self, buffer: torch.Tensor, filename: PathLike, validate: bool = False) -> int:
        return self.pread(buffer, filename, validate, False)

    def write(self, buffer: torch.Tensor, filename: PathLike, validate: bool = False) -> int:
        return self.pwrite(buffer, filename, validate, False)

    def wait(self) -> int:
        """Block until every async op has finished; return how many there were.

        Raises the first failure (OSError / EOFError naming the file) once all
        ops are finished, so no buffer is still in use when the error arrives.
        """
        completed, errors = self._engine.wait()
        validations, self._async_validations = self._async_validations, {}
        _raise_errors(errors)
        for args in validations.values():
            _validate(*args)
        return completed

    # -- single ops (rankscope's addition) ------------------------------------------
    def submit(
        self, buffer: torch.Tensor, filename: PathLike, is_read: bool, file_offset: int = 0, validate: bool = False
    ) -> int:
        """Start one async read (``is_read``) or write; returns its ticket for wait_ops / is_done
        (wait() collects it too)."""
        return self._start(is_read, buffer, filename, validate, file_offset)

    def wait_ops(self, tickets: list[int]) -> None:
        """Block until the ops of ``tickets`` have finished (others keep running); raises the
        first failure among them, as wait() does."""
        errors = self._engine.wait_ops(list(tickets))
        validations = [self._async_validations.pop(t) for t in tickets if t in self._async_validations]
        _raise_errors(errors)
        for args in validations:
            _validate(*args)

    def is_done(self, ticket: int) -> bool:
        """Whether the op of ``ticket`` has finished (without waiting)."""
        return self._engine.is_done(ticket)

    def pending(self) -> int:
        """Async ops submitted and not yet collected by wait() / wait_ops()."""
        return self._engine.pending()

    # -- pinned buffers -----------------------------------------------------------
    def new_cpu_locked_tensor(self, num_elem: int, example_tensor: torch.Tensor) -> torch.Tensor:
        """A 1-D page-aligned, page-locked CPU tensor of example_tensor's dtype."""
        return self._engine.new_cpu_locked_tensor(num_elem, example_tensor)

    def free_cpu_locked_tensor(self, tensor: torch.Tensor) -> bool:
        """Release a tensor from new_cpu_locked_tensor (memory goes with its last reference)."""
        return self._engine.free_cpu_locked_tensor(tensor)

    # -- settings -------------------------------------------------------------------
    def get_block_size(self) -> int:
        return self._engine.get_block_size()

    def get_queue_depth(self) -> int:
        return self._engine.get_queue_depth()

    def get_single_submit(self) -> bool:
        return self._engine.get_single_submit()

    def get_overlap_events(self) -> bool:
        return self._engine.get_overlap_events()

    def get_intra_op_parallelism(self) -> int:
        return self._engine.get_intra_op_parallelism()

    def _io(
        self, is_read: bool, buffer: torch.Tensor, filename: PathLike, validate: bool, async_op: bool, file_offset: int
    ) -> int:
        if async_op:
            self._start(is_read, buffer, filename, validate, file_offset)
            return 0
        path = self._check(is_read, buffer, filename, file_offset)
        _raise_errors(self._engine.run(buffer, path, is_read, file_offset))
        if validate:
            _validate(is_read, buffer, path, file_offset)
        return 1

    def _start(self, is_read: bool, buffer: torch.Tensor, filename: PathLike, validate: bool, file_offset: int) -> int:
        path = self._check(is_read, buffer, filename, file_offset)
        ticket = self._engine.submit(buffer, path, is_read, file_offset)
        if validate:
            self._async_validations[ticket] = (is_read, buffer, path, file_offset)
        return ticket

    @staticmethod
    def _check(is_read: bool, buffer: torch.Tensor, filename: PathLike, file_offset: int) -> str:
        path = os.fspath(filename)
        what = "pread into" if is_read else "pwrite from"
        if not isinstance(buffer, torch.Tensor):
            raise TypeError(f"AsyncIOHandle: {what} {type(buffer).__name__} for {path}: need a torch.Tensor")
        if buffer.device.type != "cpu" or not buffer.is_contiguous():
            raise ValueError(
                f"AsyncIOHandle: {path}: the buffer must be a contiguous CPU tensor, "
                f"got device={buffer.device}, contiguous={buffer.is_contiguous()}"
            )
        if not isinstance(file_offset, int) or file_offset < 0:
            raise ValueError(f"AsyncIOHandle: {path}: file_offset must be an int >= 0, got {file_offset!r}")
        return path


def _raise_errors(errors: list[tuple[int, str, str, str]]) -> None:
    if not errors:
        return
    err, path, op, detail = errors[0]
    more = f" (and {len(errors) - 1} more failed ops)" if len(errors) > 1 else ""
    if err == 0:
        raise EOFError(f"{op} {path}: short read: {detail}{more}")
    raise OSError(err, f"{op} failed: {os.strerror(err)} ({detail}){more}", path)


def _validate(is_read: bool, buffer: torch.Tensor, path: str, file_offset: int) -> None:
    """DeepSpeed's validate=True: compare the buffer with the file read back plainly."""
    expected = _as_bytes(buffer)
    with open(path, "rb") as f:
        f.seek(file_offset)
        actual = f.read(expected.numel())
    if len(actual) != expected.numel() or not torch.equal(
        torch.frombuffer(bytearray(actual), dtype=torch.uint8), expected
    ):
        op = "pread" if is_read else "pwrite"
        raise RuntimeError(f"{op} {path}: validation failed, file bytes at offset {file_offset} differ from the buffer")


def _as_bytes(buffer: torch.Tensor) -> torch.Tensor:
    """The tensor's memory as a flat uint8 tensor (no copy)."""
    flat = buffer.reshape(-1)
    return flat.view(torch.uint8) if flat.numel() else torch.empty(0, dtype=torch.uint8)


class _PythonEngine:
    """Same contract as the C++ AioHandle, with os.pread/os.pwrite on a thread pool."""

    def __init__(
        self, block_size: int, queue_depth: int, single_submit: bool, overlap_events: bool, intra_op_parallelism: int
    ):
        self._settings = (block_size, queue_depth, single_submit, overlap_events, intra_op_parallelism)
        self._pool = ThreadPoolExecutor(intra_op_parallelism, thread_name_prefix="rankscope-aio")
        self._lock = threading.Lock()
        self._pending: dict[int, object] = {}  # ticket -> future, in submission order
        self._next_ticket = 1

    def get_block_size(self):
        return self._settings[0]

    def get_queue_depth(self):
        return self._settings[1]

    def get_single_submit(self):
        return self._settings[2]

    def get_overlap_events(self):
        return self._settings[3]

    def get_intra_op_parallelism(self):
        return self._settings[4]

    def submit(self, tensor, path, is_read, file_offset):
        with self._lock:
            ticket = self._next_ticket
            self._next_ticket += 1
            self._pending[ticket] = self._pool.submit(self._run_op, tensor, path, is_read, file_offset)
        return ticket

    def run(self, tensor, path, is_read, file_offset):
        return self._run_op(tensor, path, is_read, file_offset)

    def wait_ops(self, tickets):
        with self._lock:
            futures = [self._pending.pop(t) for t in tickets if t in self._pending]
        return [e for future in futures for e in future.result()]

    def is_done(self, ticket):
        with self._lock:
            future = self._pending.get(ticket)
        return future is None or future.done()

    def wait(self):
        with self._lock:
            pending, self._pending = list(self._pending.values()), {}
        errors = [e for future in pending for e in future.result()]
        return len(pending), errors

    def pending(self):
        return len(self._pending)

    def new_cpu_locked_tensor(self, num_elem, example_tensor):
        return torch.empty(num_elem, dtype=example_tensor.dtype)

    def free_cpu_locked_tensor(self, tensor):
        return True

    def _run_op(self, tensor, path, is_read, file_offset):
        name = "pread" if is_read else "pwrite"
        data = memoryview(_as_bytes(tensor).numpy()) if tensor.numel() else memoryview(bytearray())
        nbytes = len(data)
        try:
            fd = os.open(path, os.O_RDONLY if is_read else os.O_WRONLY | os.O_CREAT, 0o644)
        except OSError as exc:
            return [(exc.errno, path, name, "open")]
        try:
            if is_read and os.fstat(fd).st_size < file_offset + nbytes:
                return [
                    (
                        0,
                        path,
                        name,
                        f"file has {os.fstat(fd).st_size} bytes, cannot read {nbytes} bytes at offset {file_offset}",
                    )
                ]
            block = self._settings[0] if self._settings[2] else self._settings[0] * self._settings[1]
            done = 0
            while done < nbytes:
                chunk = data[done : done + block]
                try:
                    n = (
                        os.preadv(fd, [chunk], file_offset + done)
                        if is_read
                        else os.pwrite(fd, chunk, file_offset + done)
                    )
                except OSError as exc:
                    return [(exc.errno, path, name, f"{len(chunk)} bytes at file offset {file_offset + done}")]
                if n == 0:
                    return [
                        (
                            0,
                            path,
                            name,
                            f"file ended before {len(chunk)} bytes at file offset {file_offset + done} could be read",
                        )
                    ]
                done += n
            return []
        finally:
            os.close(fd)
