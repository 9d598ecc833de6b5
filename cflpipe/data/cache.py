"""Array caches of parsed datasets (`.npz` beside the raw files) with a sha256 sidecar: a cache
that is truncated, altered or half-written is detected by its digest and rebuilt from the raw
files instead of breaking every later run (`BadZipFile`)."""

from __future__ import annotations

import hashlib
import io
import mmap
import struct
import zipfile
import zlib
from pathlib import Path
from typing import Callable

import numpy as np

from cflpipe.data.base import release_pages


def _digest_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def load_cache(path: Path, keys: tuple[str, ...]) -> dict[str, np.ndarray] | None:
    """The cached arrays, or None when the cache is missing, does not match its digest, or
    cannot be read (the caller rebuilds it)."""
    from cflpipe.store import sha256_of  # pandas: imported only when a cache is read or written

    path = Path(path)
    try:
        if not path.is_file() or _digest_path(path).read_text().strip() != sha256_of(path):
            return None
        with np.load(path, allow_pickle=False) as npz:
            return {key: npz[key] for key in keys}
    except Exception:  # any unreadable cache is rebuilt; the raw files are the source of truth
        return None


def save_cache(path: Path, **arrays: np.ndarray) -> None:
    """Write the cache and its digest (best effort: a read-only or full data folder only costs
    the speed-up). The digest goes last, so an interrupted write is never trusted."""
    from cflpipe.store import write_bytes, write_text  # pandas: imported only when writing

    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    data = buffer.getvalue()
    try:
        _digest_path(path).unlink(missing_ok=True)
        write_bytes(path, data)
        write_text(_digest_path(path), hashlib.sha256(data).hexdigest() + "\n")
    except OSError:
        pass


def mapped_inputs(path: Path, others: tuple[str, ...] = (),
                  accept: Callable[[dict[str, np.ndarray]], bool] = lambda others: True
                  ) -> tuple[dict[str, np.ndarray], tuple[mmap.mmap, ...]]:
    """x_train and x_test as read-only arrays over one memory map of the file, where each is
    stored uncompressed, unencrypted, in .npy format 1.0 or 2.0 with a plain dtype, its data
    within its member and the member's CRC-32 right (read once, a chunk at a time, the pages let
    go); the others, and any file the system cannot map, are left to np.load, which refuses a
    damaged member as before. A member's data starts after its zip local header (whose extra
    field may differ from the central directory's, so it is read) and its .npy header.

    `others` are read into memory from the same open file (a cache renamed in by another process
    meanwhile cannot mix two files); when `accept(others)` is false (a stale stamp) or one cannot
    be read, nothing is mapped or returned. With others asked for, inputs come back only if both
    x_train and x_test could be mapped."""
    inputs: dict[str, np.ndarray] = {}
    mapping = None
    try:
        with open(path, "rb") as raw, zipfile.ZipFile(raw) as archive:
            for name in others:
                with archive.open(f"{name}.npy") as member:  # zipfile checks its CRC-32 as it reads
                    inputs[name] = np.lib.format.read_array(member, allow_pickle=False)
            if not accept(inputs):
                return {}, ()
            for name in ("x_train", "x_test"):
                info = archive.NameToInfo.get(f"{name}.npy")
                if info is None or info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 0x1:
                    continue
                raw.seek(info.header_offset)
                local = raw.read(30)
                if len(local) < 30 or local[:4] != b"PK\x03\x04":
                    continue
                name_length, extra_length = struct.unpack("<HH", local[26:30])
                member_start = info.header_offset + 30 + name_length + extra_length
                with archive.open(info) as member:
                    version = np.lib.format.read_magic(member)
                    if version not in ((1, 0), (2, 0)):
                        continue
                    read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) \
                        else np.lib.format.read_array_header_2_0
                    shape, fortran, dtype = read_header(member)
                    start = member_start + member.tell()
                count = int(np.prod(shape, dtype=np.int64))
                if dtype.hasobject or start + count * dtype.itemsize != member_start + info.file_size:
                    continue
                if mapping is None:
                    mapping = mmap.mmap(raw.fileno(), 0, access=mmap.ACCESS_READ)
                if _crc32(mapping, member_start, info.file_size) != info.CRC:
                    continue
                flat = np.frombuffer(mapping, dtype=dtype, count=count, offset=start)
                inputs[name] = flat.reshape(shape[::-1]).T if fortran else flat.reshape(shape)
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):  # np.load reads it, or says what is wrong
        return {}, ()
    if others and not {"x_train", "x_test"} <= set(inputs):
        return {}, ()
    mapped = [name for name in ("x_train", "x_test") if name in inputs]
    return inputs, (() if mapping is None or not mapped else (mapping,))


def can_map(path: Path) -> bool:
    """Whether this system maps `path`'s file (some network and FUSE file systems cannot)."""
    try:
        with open(path, "rb") as raw, mmap.mmap(raw.fileno(), 0, access=mmap.ACCESS_READ):
            return True
    except (OSError, ValueError):
        return False


def _crc32(mapping: mmap.mmap, start: int, size: int, chunk: int = 32 << 20) -> int:
    crc = 0
    with memoryview(mapping) as view:
        for offset in range(start, start + size, chunk):
            crc = zlib.crc32(view[offset:min(offset + chunk, start + size)], crc)
            release_pages((mapping,))
    return crc


# Rows converted and written at once into a float cache (write_float_cache).
_ROWS_AT_ONCE = 4096


def write_float_cache(path: Path, convert: Callable[[np.ndarray], np.ndarray], **arrays: np.ndarray) -> bool:
    """An uncompressed .npz of `arrays`, x_train and x_test passed through `convert` a chunk of
    rows at a time (to_float's uint8 → float32: the float copy is never whole in memory), for
    mapped_inputs to map. Written to a temporary file and renamed, so a half-written one is never
    read; False where it cannot be written (a read-only or full folder: the caller keeps the
    arrays in memory)."""
    import fcntl

    from cflpipe.store import atomic_path

    try:
        lock = open(path.with_name(path.name + ".lock"), "a+")
    except OSError:
        return False
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another process writes it: this run keeps its arrays in memory
            return False
        except OSError:  # a file system without locks: write unlocked
            pass
        for orphan in path.parent.glob(f".{path.name}.*.tmp"):  # of a writer killed mid-way
            orphan.unlink(missing_ok=True)
        with atomic_path(path) as tmp, zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
            for name, array in arrays.items():
                if name not in ("x_train", "x_test"):
                    buffer = io.BytesIO()
                    np.save(buffer, array, allow_pickle=False)
                    archive.writestr(f"{name}.npy", buffer.getvalue())
                    continue
                first = convert(array[:1])
                with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                    np.lib.format.write_array_header_2_0(member, {
                        "descr": np.lib.format.dtype_to_descr(first.dtype), "fortran_order": False,
                        "shape": (len(array), *first.shape[1:])})
                    for start in range(0, len(array), _ROWS_AT_ONCE):
                        member.write(np.ascontiguousarray(convert(array[start:start + _ROWS_AT_ONCE])).tobytes())
    except OSError:
        return False
    finally:
        lock.close()
    return True
