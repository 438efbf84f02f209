"""Storage slow enough that saving a checkpoint into it takes a set time, as on a busy network
filesystem. The wait is in the save's own writes, so a stack taken meanwhile shows ``torch.save``
(what collector.data.findings.stuck reads as "saving a checkpoint").

    with SlowStorage(20.0, out / "checkpoint.pt") as f:   # the save takes 20 s
        torch.save(state, f)
"""

from __future__ import annotations

import io
import time
from pathlib import Path


class SlowStorage(io.RawIOBase):
    """A writable file whose writes take ``seconds`` in all from its opening (the first waits out
    the time); the bytes go to ``path``, or nowhere without one."""

    def __init__(self, seconds: float, path: Path | None = None) -> None:
        self.deadline = time.monotonic() + seconds
        self._file = open(path, "wb") if path is not None else None  # closed with this object

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        time.sleep(max(0.0, self.deadline - time.monotonic()))
        return self._file.write(data) if self._file is not None else len(data)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        super().close()
