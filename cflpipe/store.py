"""Atomic writes: every output appears whole or not at all (temp file in the same folder, fsync,
rename). Parquet is written with fixed options so the same table gives the same bytes."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import errno
import socket
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temp path beside `path`; on success it is renamed onto `path`, on error removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    share_like_new(fd)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        with open(tmp_path, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp_path, path)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise


def sha256_of(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def share_like_new(fd: int) -> None:
    """Give a file mkstemp made (0600) the mode any new file gets (0644 under the usual umask), so
    colleagues and web servers can read results and downloaded data."""
    os.fchmod(fd, 0o666 & ~_umask())


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


TEMP_GLOB = ".*.tmp"
_NO_FLOCK = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}


def sweep_temp_files(*folders: Path) -> None:
    """Remove temp files that a killed writer left (call only while holding the folder's lock)."""
    for folder in folders:
        for tmp in Path(folder).glob(TEMP_GLOB):
            tmp.unlink(missing_ok=True)


@contextmanager
def exclusive(lock_file: Path, what: str) -> Iterator[None]:
    """Hold an exclusive lock on `lock_file` (flock: released by the kernel even when the process
    is killed); a second holder is refused at once with one line naming the first."""
    from cflpipe.errors import BusyError

    lock_file.parent.mkdir(parents=True, exist_ok=True)
    handle = open(lock_file, "a+")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise BusyError(f"{what}: {holder} is writing it; wait until it finishes") from None
        except OSError as exc:
            if exc.errno not in _NO_FLOCK:
                raise
            # Some cluster file systems (Lustre without -o flock, some NFS/FUSE mounts) have no
            # flock: go on unlocked rather than refuse every run.
            print(f"warning: {lock_file}: the file system does not support locks ({exc.strerror}); "
                  f"make sure only one process writes {what}", file=sys.stderr)
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {socket.gethostname()} since "
                     f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        handle.flush()
        yield
    finally:
        handle.close()


@contextmanager
def waiting_lock(lock_file: Path) -> Iterator[None]:
    """Hold an exclusive lock on `lock_file`, waiting for another holder (for short
    read-modify-write updates of a shared file); unlocked where the file system has no flock."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    try:
        handle = open(lock_file, "a")
    except PermissionError:  # a colleague's lock file in a shared folder: flock needs no write access
        handle = open(lock_file, "r")
    with handle:
        _flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            try:
                fcntl.flock(handle, fcntl.LOCK_UN)
            except OSError:
                pass


def _flock(handle, operation: int) -> None:
    """flock `handle` (waiting for another holder); nothing where the file system has no flock."""
    try:
        fcntl.flock(handle, operation)
    except OSError as exc:
        if exc.errno not in _NO_FLOCK:
            raise


@contextmanager
def locked_record(path: Path, exclusive: bool) -> Iterator["IO[str] | None"]:
    """A small shared record (a results folder's trainer-choices.json) opened and flocked itself,
    shared to read it or exclusive to rewrite it in place (seek, truncate, write): no lock file
    beside it, and no rename, which would leave a waiting writer holding the lock of a replaced
    file. Yields None where a reader finds no record. Unlocked where the file system has no flock."""
    try:  # a+ makes the record where a writer finds none; its writes land at the (truncated) end
        handle = open(path, "a+" if exclusive else "r", encoding="utf-8")
    except FileNotFoundError:
        yield None
        return
    with handle:
        _flock(handle, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        handle.seek(0)
        yield handle


def rewrite_locked(handle: "IO[str]", text: str) -> None:
    """Replace a `locked_record`'s content (held exclusively) and make it durable."""
    handle.seek(0)
    handle.truncate()
    handle.write(text)
    handle.flush()
    os.fsync(handle.fileno())


def write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_text(path: str | Path, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def write_json(path: str | Path, obj) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")


def _json_default(value):
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def write_parquet(path: str | Path, table: pd.DataFrame | pa.Table) -> None:
    if isinstance(table, pd.DataFrame):
        table = pa.Table.from_pandas(table, preserve_index=False)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd", write_statistics=True)


def read_parquet(path: str | Path) -> pd.DataFrame:
    return pq.read_table(path).to_pandas()
