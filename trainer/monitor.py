"""DeepSpeed's Monitor: scalar events ``(tag, value, samples)`` go to the
backends the config enables, plus rankscope telemetry.

    "csv_monitor": {"enabled": true, "output_path": "output/ds_logs/", "job_name": "train_bert"},
    "tensorboard": {"enabled": true, "output_path": "output/ds_logs/", "job_name": "train_bert"}

- ``csv_monitor``: DeepSpeed's layout exactly: ``<output_path>/<job_name>/<tag>.csv``
  with ``/`` and spaces in the tag turned into ``_``; the first write of a file
  by this process appends the header ``step,<last part of the tag>``, every
  event a row ``<samples>,<value>``.
- ``tensorboard``: a ``SummaryWriter`` on ``<output_path>/<job_name>``, one
  ``add_scalar(tag, value, samples)`` per event, flushed after every batch.
- telemetry: every event is emitted to the ``monitor`` table
  (``step`` = ``tag``'s samples) whenever a rankscope session is active.

As in DeepSpeed, only rank 0 writes files (other ranks would race on the same
paths); every rank emits telemetry, so the ``monitor`` table has a row per rank.
An empty ``output_path`` means the working directory, as in DeepSpeed.

Nothing here blocks the training thread: ``write_events`` queues the batch for a
background writer thread, which also turns tensor values into numbers (so the
caller never waits on the device). ``flush()`` waits for the queue to drain;
``close()`` (also run at interpreter exit) flushes and closes the files. A write
that fails (disk full, path removed) is reported once per backend and the run
goes on.
"""

from __future__ import annotations

import atexit
import csv
import functools
import logging
import os
import queue
import threading
import warnings
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any, ClassVar

import torch

from collector.rank import session
from collector.rank.clock import CLOCK
from collector.rank.config import ConfigBlock, ConfigError
from trainer import reporting

__all__ = ["CSVMonitorConfig", "MonitorMaster", "TensorBoardConfig"]

log = logging.getLogger(__name__)

Event = tuple[str, Any, int]  # (tag, value, samples)


# ----------------------------------------------------------------------------- config


@dataclass(kw_only=True)
class _FileMonitorConfig(ConfigBlock):
    """A file backend's block (``csv_monitor``, ``tensorboard``), with DeepSpeed's keys and defaults."""

    enabled: bool = False
    output_path: str | None = ""  # "" or None: the working directory
    job_name: str = "DeepSpeedJobName"

    def validate(self) -> None:
        if not self.job_name:
            self.fail("job_name", "must be a non-empty string", self.job_name)

    @property
    def log_dir(self) -> str:
        return os.path.abspath(os.path.join(self.output_path or "", self.job_name))


@dataclass(kw_only=True)
class CSVMonitorConfig(_FileMonitorConfig):
    SECTION: ClassVar[str] = "csv_monitor"


@dataclass(kw_only=True)
class TensorBoardConfig(_FileMonitorConfig):
    SECTION: ClassVar[str] = "tensorboard"


# DeepSpeed backends that need third-party services; their blocks are accepted and ignored.
_UNBUNDLED = ("wandb", "comet")


def _prepare_log_dir(cfg: _FileMonitorConfig) -> str:
    """Create the backend's directory now, so a bad path fails at start-up naming the key."""
    path = cfg.log_dir
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        cfg.fail("output_path", f"cannot create {path!r}: {e.strerror or e}", cfg.output_path)
    if not os.access(path, os.W_OK | os.X_OK):
        cfg.fail("output_path", f"{path!r} is not writable", cfg.output_path)
    return path


# ----------------------------------------------------------------------------- backends (writer thread only)


class _CSVBackend:
    name = "csv_monitor"

    def __init__(self, log_dir: str):
        self.log_dir = log_dir
        self.headers_written: set[str] = set()  # per process, as DeepSpeed's self.filenames

    def write(self, tag: str, value, samples: int) -> None:
        filename = tag.replace("/", "_").replace(" ", "_")
        # DeepSpeed's engine joins tag parts with '/': the column is the last part.
        header = tag.rsplit("/", 1)[-1]
        with open(os.path.join(self.log_dir, filename + ".csv"), "a+", newline="") as f:
            writer = csv.writer(f)
            if filename not in self.headers_written:
                writer.writerow(["step", header])
                self.headers_written.add(filename)
            writer.writerow([samples, value])

    def flush(self) -> None:
        pass  # every write closes its file

    def close(self) -> None:
        pass


class _TensorBoardBackend:
    name = "tensorboard"

    def __init__(self, log_dir: str):
        from torch.utils.tensorboard import SummaryWriter  # slow import: only when enabled

        self.writer = SummaryWriter(log_dir=log_dir)

    def write(self, tag: str, value, samples: int) -> None:
        self.writer.add_scalar(tag, value, samples)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


# ----------------------------------------------------------------------------- the monitor


def _telemetry_active() -> bool:
    return session.active() is not None


def _close_at_exit(ref: weakref.ref[MonitorMaster]) -> None:
    monitor = ref()
    if monitor is not None:
        monitor.close()


_STOP = object()


class MonitorMaster:
    """All monitor backends of one engine config: the whole config dict, whose ``csv_monitor``
    and ``tensorboard`` entries may also be their blocks already built."""

    def __init__(self, config: Mapping | None):
        config = config or {}
        if not isinstance(config, Mapping):
            raise ConfigError(f"monitor config must be the engine config dict, got {type(config).__name__}")
        self.rank = reporting.global_rank()
        self.csv_config = CSVMonitorConfig.from_dict(config.get(CSVMonitorConfig.SECTION))
        self.tensorboard_config = TensorBoardConfig.from_dict(config.get(TensorBoardConfig.SECTION))
        for section in _UNBUNDLED:
            block = config.get(section)
            if isinstance(block, dict) and block.get("enabled"):
                warnings.warn(
                    f"{section}.enabled: the {section} monitor is not bundled with rankscope; "
                    "its events go to csv_monitor / tensorboard / telemetry only",
                    stacklevel=2,
                )
        self._backends: list = []
        if reporting.is_reporting_rank(self.rank):
            if self.csv_config.enabled:
                self._backends.append(_CSVBackend(_prepare_log_dir(self.csv_config)))
            if self.tensorboard_config.enabled:
                self._backends.append(_TensorBoardBackend(_prepare_log_dir(self.tensorboard_config)))
        self._queue: queue.Queue = queue.Queue()  # unbounded: a slow disk delays files, never training
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._failed: set[str] = set()  # backends already reported as failing
        self._exit_hook = None

    @property
    def enabled(self) -> bool:
        """Whether ``write_events`` records anything on this rank: a file backend
        here (rank 0) or an active rankscope session (every rank)."""
        return not self._closed and (bool(self._backends) or _telemetry_active())

    def write_events(self, event_list: Iterable[Event]) -> None:
        """Queue ``[(tag, value, samples), ...]``; returns at once. Values may be
        numbers or 0-d tensors (read on the writer thread, not here)."""
        if not self.enabled:
            return
        now = CLOCK.now_ns()
        batch = [self._checked(event) for event in event_list]
        if not batch:
            return
        with self._lock:
            if self._closed:
                return
            if self._thread is None:
                self._thread = threading.Thread(target=self._drain, name="rankscope-monitor", daemon=True)
                self._thread.start()
                # Registered now, not at import: atexit runs last-in first-out, so this
                # drains before a telemetry session started earlier is stopped.
                self._exit_hook = functools.partial(_close_at_exit, weakref.ref(self))
                atexit.register(self._exit_hook)
            # The training step now, not when the writer thread gets to it: a row's step is the
            # step it belongs to, its samples DeepSpeed's x value (the engine's global_samples).
            self._queue.put((now, session.get_step(), batch))

    def flush(self) -> None:
        """Wait until every queued event is written and flushed."""
        if self._thread is not None:
            self._queue.join()

    def close(self, timeout: float | None = 60.0) -> None:
        """Flush, stop the writer thread and close the files. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
            if thread is not None:
                self._queue.put(_STOP)
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                log.warning("monitor: writer still busy after %ss at close; unwritten events may be lost", timeout)
                return
        for backend in self._backends:
            self._guarded(backend, backend.close)
        if self._exit_hook is not None:
            atexit.unregister(self._exit_hook)

    @staticmethod
    def _checked(event) -> tuple[str, Any, int]:
        try:
            tag, value, samples = event
        except (TypeError, ValueError):
            raise TypeError(f"monitor event must be (tag, value, samples), got {event!r}") from None
        if not isinstance(tag, str):
            raise TypeError(f"monitor event tag must be a string, got {tag!r}")
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise TypeError(f"monitor event {tag!r}: value must be a scalar, got shape {tuple(value.shape)}")
            # A private copy: the caller may reuse its buffer. Copying stays on the device, no sync.
            value = value.detach().clone()
        elif not isinstance(value, Real):
            raise TypeError(f"monitor event {tag!r}: value must be a number, got {value!r}")
        if isinstance(samples, bool) or not isinstance(samples, Integral):
            raise TypeError(f"monitor event {tag!r}: samples must be an integer, got {samples!r}")
        return tag, value, int(samples)

    # -- writer thread

    def _drain(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is _STOP:
                    return
                self._write_batch(*item)
            finally:
                self._queue.task_done()

    def _write_batch(self, time_ns: int, step: int, batch: list[tuple[str, Any, int]]) -> None:
        telemetry_on = _telemetry_active()
        for tag, value, samples in batch:
            if isinstance(value, torch.Tensor):
                value = value.item()
            if telemetry_on:
                session.emit("monitor", step=step, tag=tag, value=float(value), samples=samples, time_ns=time_ns)
            for backend in self._backends:
                self._guarded(backend, backend.write, tag, value, samples)
        for backend in self._backends:
            self._guarded(backend, backend.flush)

    def _guarded(self, backend, fn, *args) -> None:
        try:
            fn(*args)
        except Exception as e:  # a full disk must not kill the writer, let alone training
            if backend.name not in self._failed:
                self._failed.add(backend.name)
                log.warning("monitor: %s write failed (%s); further failures are not reported", backend.name, e)
