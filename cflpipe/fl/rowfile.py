"""A (rows × …) table kept in a file of the run's folder and memory-mapped (`training.client_store:
disk`): the client store's tables where clients × parameters would not fit in memory.

The table is a plain torch tensor over the mapping, so every method reads and writes it as it
would a table in memory, with the same bytes. What keeps memory down is `release`: the engine
hands the pages a round touched back to the kernel after the round (the mapping is shared, so
the data stays in the file and the page cache; the process's resident set no longer holds it),
and a checkpoint's reads and writes of the whole table release as they go. A table in memory
would hold every client's row resident from the first round.
"""

from __future__ import annotations

import mmap
import os
import shutil
import weakref
from pathlib import Path

import numpy as np
import torch

from cflpipe.errors import SpecError

# Pages handed back at a time while a whole table is read or written (fill, checkpoint, resume).
RELEASE_BYTES = 64 << 20
_PAGE = mmap.PAGESIZE
_DONTNEED = getattr(mmap, "MADV_DONTNEED", None)
# The tables open in this process by the address of their first byte: a checkpoint reading or
# writing a tensor asks whether it is one, to release its pages as it goes.
_OPEN: "weakref.WeakValueDictionary[int, RowFile]" = weakref.WeakValueDictionary()


class RowFile:
    """`rows` copies of `default` in the file `path` (created, or overwritten), as `tensor`."""

    def __init__(self, path: Path, default: torch.Tensor, rows: int):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        dtype = torch.empty(0, dtype=default.dtype).numpy().dtype
        self.row_bytes = default.numel() * default.element_size()
        size = max(rows * self.row_bytes, 1)
        # Every block reserved now: a disk that fills later would kill the process with SIGBUS
        # at a write through the mapping, where this says so in one line.
        free = shutil.disk_usage(self.path.parent).free
        if size > free:
            raise SpecError(f"training.client_store: disk needs {size / 2**30:.1f} GiB for {self.path.name} in "
                            f"{self.path.parent}, where {free / 2**30:.1f} GiB are free; free space or use memory")
        with open(self.path, "wb") as handle:
            try:
                if hasattr(os, "posix_fallocate"):
                    os.posix_fallocate(handle.fileno(), 0, size)
                else:  # macOS, Windows: sparse, checked against the free space above only
                    handle.truncate(size)
            except OSError as exc:
                raise SpecError(f"training.client_store: disk cannot reserve {size / 2**30:.1f} GiB for "
                                f"{self.path} ({exc.strerror}); free space or use memory") from None
        self._map = np.memmap(self.path, dtype=np.uint8, mode="r+", shape=(size,))
        flat = self._map[:rows * self.row_bytes].view(dtype)
        self.tensor = torch.from_numpy(flat).view(rows, *default.shape)
        _OPEN[self.tensor.data_ptr()] = self
        step = max(1, RELEASE_BYTES // max(self.row_bytes, 1))
        row = default.detach().to("cpu")
        for start in range(0, rows, step):
            self.tensor[start:start + step] = row
            self.release(start, start + step)

    def release(self, start: int = 0, stop: int | None = None) -> None:
        """Hand rows start … stop − 1 (all by default) back to the kernel: the file keeps them."""
        rows = self.tensor.shape[0]
        stop = rows if stop is None else min(stop, rows)
        first = (start * self.row_bytes) // _PAGE * _PAGE
        last = stop * self.row_bytes
        if last > first and _DONTNEED is not None:  # where the platform has no madvise, pages stay
            self._map._mmap.madvise(_DONTNEED, first, last - first)

    def remove(self) -> None:
        """Delete the file. The mapping stays until the last tensor over it is gone (unmapping
        it under a live view would crash the process at its next read), then so do its blocks."""
        _OPEN.pop(self.tensor.data_ptr(), None)
        self.path.unlink(missing_ok=True)


def owner(table: object) -> RowFile | None:
    """The RowFile whose whole table `table` is, or None (for anything else)."""
    if not isinstance(table, torch.Tensor):
        return None
    found = _OPEN.get(table.data_ptr())
    return found if found is not None and found.tensor.shape == table.shape else None


def chunks(table: torch.Tensor, rows_per_step: int):
    """(start, stop) row ranges over `table`, its pages released after each where it is a
    RowFile's: a whole-table read or write that stays within RELEASE_BYTES of resident pages."""
    found = owner(table)
    rows = table.shape[0]
    row_bytes = table[0].numel() * table.element_size() if rows else 0
    group = rows_per_step
    if found is not None:
        group = max(rows_per_step, RELEASE_BYTES // max(row_bytes, 1) // rows_per_step * rows_per_step)
    for start in range(0, rows, group):
        stop = min(start + group, rows)
        for inner in range(start, stop, rows_per_step):
            yield inner, min(inner + rows_per_step, stop)
        if found is not None:
            found.release(start, stop)



def copy_rows(target: torch.Tensor, source: torch.Tensor) -> None:
    """target[:] = source, by chunks released as they go where target is a RowFile's (a table
    read back on resume, or assigned whole); nothing where source is target."""
    if source.data_ptr() == target.data_ptr():
        return
    row_bytes = target[0].numel() * target.element_size() if len(target) else 1
    for start, stop in chunks(target, max(1, (RELEASE_BYTES // 16) // max(row_bytes, 1))):
        target[start:stop] = source[start:stop]
