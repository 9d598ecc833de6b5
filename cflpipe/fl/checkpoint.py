"""A run's checkpoint: `state/state.pt` (torch.save of plain containers and tensors), verified by
its sha256 in `state/state.sha256`, with large per-client tables kept as row blocks beside it.

Methods with a model per client (K-means CFL's latest uploads, FedAC's client models, Ditto's
personal models) hold a (clients × parameters) table that is nearly all of a checkpoint, and
most of whose rows do not change between two checkpoints when a few clients are sampled per
round. So every tensor of two or more dimensions and at least `MIN_ROWS_BYTES` is cut into
blocks of rows, each stored once under its sha256 in `state/rows/<sha256>.bin` (raw bytes);
`state.pt` holds the blocks' names in its place. A checkpoint writes only the blocks that no
earlier checkpoint wrote, then `state.pt`, then removes the blocks it no longer names: a crash
before `state.pt` is written leaves the previous checkpoint whole, one after it the new one.
`state.sha256` names the new state's digest and, on a second line, the previous one's: it is
written before the new `state.pt` is renamed into place, so a crash in between leaves the previous
checkpoint, still verified, and the resume falls back to it (losing one checkpoint interval at
most, and saying so). Every block is checked against its name when read, as `state.pt` is against
its digest.

The blocks are files of the run's folder, one per distinct row: a run keeps up to one inode per
client, and two processes writing one run (possible only where flock does not work, see
docs/architecture.md) would remove each other's blocks. Tensors that shared storage come back as
separate tensors, every one contiguous: no method's state relies on either.
"""

from __future__ import annotations

import errno
import hashlib
import re
import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from cflpipe import store
from cflpipe.fl.rowfile import chunks

# The sha256 of state/state.pt, verified before a resume.
STATE_HASH_FILE = "state.sha256"
ROWS_FOLDER = "rows"
# Tensors smaller than this stay inside state.pt (a 1,000-client table of a 256-parameter model).
MIN_ROWS_BYTES = 1 << 20
# Rows are grouped into blocks of about this size: one row per block from 64 KiB rows on (a
# 16k-parameter model), so a checkpoint rewrites little more than the rows that changed.
BLOCK_BYTES = 1 << 16
# Below this much free space a failed torch.save is taken for a full disk.
MIN_FREE_BYTES = 1 << 20
_ROWS_KEY = "__rows__"
_BLOCK_NAME = re.compile(r"[0-9a-f]{64}")


def rows_folder(path: Path) -> Path:
    return Path(path).with_name(ROWS_FOLDER)


def write_state(path: Path, state: dict[str, Any]) -> None:
    path = Path(path)
    folder = rows_folder(path)
    named: set[str] = set()
    manifest = _externalize(state, folder, named)
    # The state on disk is the fallback: the engine discards a checkpoint it does not resume from
    # (damaged, or under --force), so the one left is the one the first digest names, and it is not
    # read again here (a whole model per checkpoint where it has no row blocks).
    previous = _digests(path)[:1] if path.is_file() else []
    with store.atomic_path(path) as tmp:
        try:
            torch.save(manifest, tmp)
        except RuntimeError as exc:  # torch's writer says "unexpected pos …" where the OS says ENOSPC
            if shutil.disk_usage(tmp.parent).free < MIN_FREE_BYTES:
                raise OSError(errno.ENOSPC, "No space left on device", str(path)) from exc
            raise RuntimeError(f"{path}: torch.save failed ({' '.join(str(exc).split())[:160]})") from exc
        # The digest is written before the state is renamed into place, with the previous
        # state's: a crash in between leaves the previous checkpoint, verified by the second line.
        store.write_text(path.with_name(STATE_HASH_FILE), "".join(f"{d}\n" for d in [store.sha256_of(tmp), *previous]))
    if folder.is_dir():
        for block in folder.glob("*.bin"):
            if block.stem not in named:  # an earlier checkpoint's rows that changed since
                block.unlink(missing_ok=True)
        if not named:
            try:
                folder.rmdir()
            except OSError:  # a killed writer's temp file, swept with the run's others
                pass


def _digests(path: Path) -> list[str]:
    """The digests `state.sha256` names: the newest state's, then the one before it."""
    try:
        return path.with_name(STATE_HASH_FILE).read_text().split()[:2]
    except (OSError, UnicodeDecodeError):
        return []


def adopt_previous(path: Path) -> None:
    """After a fallback to the previous checkpoint: its digest becomes the newest, so the next
    checkpoint names the state actually on disk as its own fallback."""
    digests = _digests(Path(path))
    if len(digests) == 2:
        store.write_text(Path(path).with_name(STATE_HASH_FILE), f"{digests[1]}\n")


def read_state(path: Path, targets: dict[tuple[str, ...], torch.Tensor] | None = None,
               wanted: Callable[[dict[str, Any]], bool] | None = None) -> tuple[dict[str, Any] | None, str | None]:
    """A run's checkpoint, verified against its digest and its blocks' names: (state, None), or
    (None, the problem). A state that matches the previous digest (a save interrupted before its
    rename) is returned with state["__previous__"] = True. `targets`: tables, by their keys'
    path in the state (("clients", name)), that a row table of the same shape and dtype is read
    into rather than into memory (the client store on disk), once its blocks all check, and only
    where `wanted(state)` (of the state before its row tables are read: its config, say) holds."""
    path = Path(path)
    digest = path.with_name(STATE_HASH_FILE)
    if not digest.exists():
        return None, f"no {STATE_HASH_FILE} beside it"
    digests, actual = _digests(path), store.sha256_of(path)
    if actual not in digests:
        return None, f"its content does not match {STATE_HASH_FILE} (a truncated or altered file)"
    try:
        # Loaded to the CPU: load_state_dict methods move tensors to the device themselves
        # and read index arrays with .numpy(), which a CUDA tensor refuses.
        manifest = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a file torch cannot read: same treatment as a bad digest
        return None, f"unreadable ({type(exc).__name__})"
    try:
        into = (targets or {}) if wanted is None or (isinstance(manifest, dict) and wanted(manifest)) else {}
        # every block of every target checked before any target is written: a damaged checkpoint
        # leaves them all as they were
        _internalize(manifest, rows_folder(path), into, (), check_only=True)
        state = _internalize(manifest, rows_folder(path), into, ())
    except _BadBlock as exc:
        return None, str(exc)
    if actual != digests[0]:
        if not isinstance(state, dict):
            return None, "not a checkpoint"
        state["__previous__"] = True
    return state, None


def state_bytes(path: Path) -> int:
    """Bytes on disk of a checkpoint: state.pt and the row blocks beside it (a crash can leave a
    block the next checkpoint removes)."""
    path = Path(path)
    folder = rows_folder(path)
    blocks = sum(block.stat().st_size for block in folder.glob("*.bin")) if folder.is_dir() else 0
    return path.stat().st_size + blocks


def manifest_bytes(state: dict[str, Any]) -> int:
    """Bytes torch.save writes for a state that holds no table large enough for row blocks."""
    import io

    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getbuffer().nbytes


class _BadBlock(Exception):
    pass


def _externalize(value: Any, folder: Path, named: set[str]) -> Any:
    if isinstance(value, torch.Tensor):
        if value.dim() >= 2 and value.numel() * value.element_size() >= MIN_ROWS_BYTES:
            return {_ROWS_KEY: _write_blocks(value, folder, named)}
        return value
    if isinstance(value, dict):
        return {key: _externalize(item, folder, named) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_externalize(item, folder, named) for item in value)
    return value


def _write_blocks(table: torch.Tensor, folder: Path, named: set[str]) -> dict[str, Any]:
    table = table.detach().to("cpu").contiguous()
    row_bytes = table[0].numel() * table.element_size()
    rows_per_block = max(1, BLOCK_BYTES // max(row_bytes, 1))
    raw = table.reshape(-1).view(torch.uint8).numpy()  # no copy: the table's own bytes
    names = []
    for start, stop in chunks(table, rows_per_block):  # a table on disk is released as it is read
        chunk = raw[start * row_bytes:stop * row_bytes]
        name = hashlib.sha256(chunk).hexdigest()
        names.append(name)
        if name not in named:
            named.add(name)
            block = folder / f"{name}.bin"
            # Written by an earlier checkpoint: the same bytes, unless the file was cut short.
            if not block.is_file() or block.stat().st_size != chunk.size:
                with store.atomic_path(block) as tmp:
                    tmp.write_bytes(chunk)
    return {"dtype": str(table.dtype).removeprefix("torch."), "shape": list(table.shape),
            "rows_per_block": rows_per_block, "blocks": names}


def _internalize(value: Any, folder: Path, targets: dict[tuple[str, ...], torch.Tensor], at: tuple,
                 check_only: bool = False) -> Any:
    """The state with its row tables read back (into `targets` where they fit); `check_only`:
    only the targets' blocks read (into scratch) and checked, nothing returned."""
    if isinstance(value, dict):
        if set(value) == {_ROWS_KEY}:
            if check_only:
                return _read_blocks(value[_ROWS_KEY], folder, targets[at], check_only) if at in targets else None
            return _read_blocks(value[_ROWS_KEY], folder, targets.get(at))
        return {key: _internalize(item, folder, targets, (*at, key), check_only) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_internalize(item, folder, targets, (*at, i), check_only) for i, item in enumerate(value))
    return value


def _read_blocks(entry: dict[str, Any], folder: Path, target: torch.Tensor | None = None,
                 check_only: bool = False) -> torch.Tensor | None:
    try:
        dtype = getattr(torch, entry["dtype"])
        shape, rows_per_block, names = [int(n) for n in entry["shape"]], int(entry["rows_per_block"]), entry["blocks"]
        if not isinstance(dtype, torch.dtype) or len(shape) < 2 or rows_per_block < 1 or min(shape) < 0:
            raise ValueError
    except (KeyError, TypeError, ValueError, AttributeError):
        raise _BadBlock(f"a row table entry it cannot read in {folder.parent / 'state.pt'}") from None
    try:
        fits = target is not None and list(target.shape) == shape and target.dtype == dtype
        if check_only and not fits:  # read into memory later, checked as it is read
            return None
        table = target if fits else torch.empty(shape, dtype=dtype)
        raw = table.reshape(-1).view(torch.uint8).numpy()
    except (RuntimeError, MemoryError, TypeError, ValueError):  # a dtype or size no table has
        raise _BadBlock(f"a row table entry it cannot read in {folder.parent / 'state.pt'}") from None
    row_bytes = raw.size // shape[0] if shape[0] else 0
    if len(names) != -(-shape[0] // rows_per_block):
        raise _BadBlock(f"{len(names)} row blocks where its table of {shape[0]} rows needs another number")

    def read(index: int, into: np.ndarray) -> None:
        name = names[index]
        if not isinstance(name, str) or not _BLOCK_NAME.fullmatch(name):
            raise _BadBlock(f"a row block name that is not a sha256 ({str(name)[:80]!r})")
        block = folder / f"{name}.bin"
        try:
            with open(block, "rb") as handle:
                filled = handle.readinto(memoryview(into))
                extra = handle.read(1)
        except OSError:
            raise _BadBlock(f"its row block {block} is missing") from None
        if filled != into.size or extra or hashlib.sha256(into).hexdigest() != name:
            raise _BadBlock(f"its row block {block} does not match its name (a truncated or altered file)")

    if check_only:  # a target's blocks read into scratch and checked, the target untouched
        if fits:
            scratch = np.empty(rows_per_block * row_bytes, dtype=np.uint8)
            for index, first in enumerate(range(0, shape[0], rows_per_block)):
                read(index, scratch[:(min(first + rows_per_block, shape[0]) - first) * row_bytes])
        return None
    for index, (first, last) in enumerate(chunks(table, rows_per_block)):  # a target on disk released as it fills
        read(index, raw[first * row_bytes:last * row_bytes])
    return table
