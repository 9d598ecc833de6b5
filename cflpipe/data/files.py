"""Bring your own dataset: `dataset: {name: files, path: FILE, ...}` with FILE one of

- NumPy `.npz`: `x_train`, `y_train`, `x_test`, `y_test`, and optionally `source_train` and
  `source_test` (one generating device per sample, for the `natural` partition). Inputs are
  (N, D) feature vectors or (N, C, H, W) images; labels integers 0..classes−1. Loaded without
  pickle support, so an object array is refused rather than executed. Stored uncompressed
  (`np.savez`, not `savez_compressed`), `x_train` and `x_test` are read through a memory map of
  the file rather than into memory: a dataset larger than the machine's memory can still be
  partitioned, and clients' tensors are built without a second copy beside them (not with
  `standardize: true`, whose scaled features are a copy).
- Parquet: one row per sample with a label column (`label`), optionally `split` (train/test; absent:
  every row is a training row) and `source` (device); the inputs are every other column (numbers),
  or with `image: COLUMN` one column of flat number lists reshaped to `shape` (C, H, W).

Everything is checked up front (shapes, dtypes, label range, NaN/inf, unknown columns) and each
problem is one line naming the file. `path` is relative to the directory cflpipe runs in (the
repository root for Snakemake and DVC). Images are standardized per channel like every image
dataset; feature vectors are used as given unless `standardize: true` (per feature, with the
train split's statistics): features on very different scales (unscaled wine data: 36 % for
FedAvg and IFCA alike) want it.
"""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from cflpipe.data.base import Dataset, DatasetInfo, register, release_pages
from cflpipe.data.cache import mapped_inputs
from cflpipe.errors import DataError

_SPLITS = ("train", "test")


class FilesParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    path: str = Field(min_length=1, description="a .npz or .parquet file (relative to the working directory)")
    classes: int | None = Field(None, ge=2, le=100_000, description="number of classes (default: largest label + 1)")
    label: str = Field("label", min_length=1, description="Parquet: the label column")
    image: str | None = Field(None, min_length=1, description="Parquet: a column of flat image arrays")
    shape: list[int] | None = Field(None, min_length=3, max_length=3,
                                     description="Parquet with image: (channels, height, width) of each image")
    standardize: bool = Field(False, description="feature vectors: scale each feature to mean 0 and std 1 with "
                                                 "the train split's statistics (images are standardized per "
                                                 "channel anyway)")


# Rows checked at once: the NaN check's masks stay small beside the data.
ROWS_AT_ONCE = 4096


def load_files(params: FilesParams, data_dir: Path) -> Dataset:
    path = Path(params.path)
    if not path.is_file():
        raise DataError(f"{path}: no such file (dataset files: path is relative to the working directory "
                        f"{Path.cwd()})")
    suffix = path.suffix.lower()
    mapped: tuple[mmap.mmap, ...] = ()
    if suffix == ".npz":
        arrays, mapped = _read_npz(path)
    elif suffix == ".parquet":
        arrays = _read_parquet(path, params)
    else:
        raise DataError(f"{path}: dataset files must be .npz or .parquet, got {suffix or 'no suffix'!r}")
    dataset = _checked(path, arrays, params.classes, mapped)
    return _standardized(dataset) if params.standardize and not dataset.is_image else dataset


def _standardized(dataset: Dataset) -> Dataset:
    """Each feature to mean 0, std 1 with the train split's statistics (test samples are scaled
    with them too, never fitted on); a constant feature is centred only."""
    from dataclasses import replace

    mean = dataset.x_train.mean(axis=0, dtype=np.float64)
    std = dataset.x_train.std(axis=0, dtype=np.float64)
    std[std == 0] = 1.0
    scale = lambda x: ((x - mean) / std).astype(np.float32)  # noqa: E731
    return replace(dataset, x_train=scale(dataset.x_train), x_test=scale(dataset.x_test))


def _read_npz(path: Path) -> tuple[dict[str, np.ndarray], tuple[mmap.mmap, ...]]:
    """The arrays of a dataset .npz, x_train and x_test memory-mapped where stored uncompressed,
    and the memory map (if any)."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            names = set(npz.files)
            missing = [k for k in ("x_train", "y_train", "x_test", "y_test") if k not in names]
            if missing:
                raise DataError(f"{path}: missing arrays {', '.join(missing)}; a dataset .npz holds x_train, "
                                f"y_train, x_test, y_test (and optionally source_train, source_test)")
            unknown = sorted(names - {"x_train", "y_train", "x_test", "y_test", "source_train", "source_test"})
            if unknown:
                raise DataError(f"{path}: unknown arrays {', '.join(unknown)}; allowed: x_train, y_train, x_test, "
                                f"y_test, source_train, source_test")
            inputs, mapping = mapped_inputs(path)
            return {name: inputs[name] if name in inputs else npz[name] for name in names}, mapping
    except DataError:
        raise
    except ValueError as exc:  # object arrays need pickle, which is refused
        raise DataError(f"{path}: cannot be read without pickle ({' '.join(str(exc).split())[:100]}); "
                        f"store numeric arrays") from None
    except Exception as exc:  # a damaged or foreign file
        raise DataError(f"{path}: not a readable .npz file ({type(exc).__name__})") from None


def _read_parquet(path: Path, params: FilesParams) -> dict[str, np.ndarray]:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as exc:
        raise DataError(f"{path}: not a readable Parquet file ({type(exc).__name__})") from None
    columns = table.column_names
    if params.label not in columns:
        raise DataError(f"{path}: no label column {params.label!r}; columns: {', '.join(columns)[:200]}")
    if "split" in columns:
        split = np.asarray(table.column("split").to_pylist(), dtype=object)
        bad = sorted({str(v) for v in split if v not in _SPLITS})
        if bad:
            raise DataError(f"{path}: column split must hold 'train' or 'test', got {', '.join(bad)[:80]}")
    else:
        split = np.full(table.num_rows, "train", dtype=object)
    special = {params.label, "split", "source"}
    if params.image is not None:
        if params.image not in columns:
            raise DataError(f"{path}: no image column {params.image!r}; columns: {', '.join(columns)[:200]}")
        if params.shape is None:
            raise DataError(f"{path}: image: {params.image} needs shape: [channels, height, width]")
        extra = [c for c in columns if c not in special | {params.image}]
        if extra:
            raise DataError(f"{path}: unexpected columns {', '.join(extra)[:120]} next to the image column")
        cells = table.column(params.image)
        per_row = int(np.prod(params.shape))
        if cells.null_count:
            raise DataError(f"{path}: column {params.image} has {cells.null_count} missing images")
        depth = 0
        while pa.types.is_list(cells.type) or pa.types.is_large_list(cells.type) \
                or pa.types.is_fixed_size_list(cells.type):
            if depth == 0 and table.num_rows:
                lengths = pc.list_value_length(cells).to_numpy(zero_copy_only=False)
                if pa.types.is_list(pc.list_flatten(cells).type) or pa.types.is_large_list(pc.list_flatten(cells).type):
                    lengths = None  # nested rows: the total below is checked instead
                if lengths is not None and np.any(lengths != per_row):
                    row = int(np.flatnonzero(lengths != per_row)[0])
                    raise DataError(f"{path}: column {params.image} must hold {per_row} numbers per row "
                                    f"(shape {params.shape}); row {row} has {int(lengths[row])}")
            cells = pc.list_flatten(cells)
            depth += 1
        values = _numbers(path, params.image, cells)
        if len(values) != per_row * table.num_rows:
            raise DataError(f"{path}: column {params.image} must hold {per_row} numbers per row "
                            f"(shape {params.shape}), got {len(values)} in {table.num_rows} rows")
        x = values.reshape(table.num_rows, *params.shape)
    else:
        features = [c for c in columns if c not in special]
        if not features:
            raise DataError(f"{path}: no feature columns besides {', '.join(sorted(special & set(columns)))}")
        x = np.stack([_numbers(path, c, table.column(c)) for c in features], axis=1) if table.num_rows \
            else np.empty((0, len(features)), np.float32)
    y = _numbers(path, params.label, table.column(params.label))
    arrays = {}
    for name in _SPLITS:
        rows = split == name
        arrays[f"x_{name}"], arrays[f"y_{name}"] = x[rows], y[rows]
        if "source" in columns:
            arrays[f"source_{name}"] = _numbers(path, "source", table.column("source"))[rows]
    return arrays


def _numbers(path: Path, column: str, values) -> np.ndarray:
    import pyarrow as pa

    kind = values.type
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)):
        raise DataError(f"{path}: column {column} must hold numbers, got {kind}")
    if values.null_count:
        raise DataError(f"{path}: column {column} has {values.null_count} missing values")
    return values.to_numpy(zero_copy_only=False)


def _checked(path: Path, arrays: dict[str, np.ndarray], classes: int | None,
             mapped: tuple[mmap.mmap, ...] = ()) -> Dataset:
    for name in ("x_train", "x_test"):
        x = arrays[name]
        if x.dtype.kind not in "biuf":
            raise DataError(f"{path}: {name} must be numbers, got dtype {x.dtype}")
        if x.ndim not in (2, 4):
            raise DataError(f"{path}: {name} must be (N, D) features or (N, C, H, W) images, got shape {x.shape}")
        with np.errstate(over="ignore", invalid="ignore"):
            # what training uses: values beyond float32 become inf (no copy when already float32)
            x = arrays[name] = x.astype(np.float32, copy=False)
        bad = 0
        for i in range(0, len(x), ROWS_AT_ONCE):
            bad += int(np.count_nonzero(~np.isfinite(x[i:i + ROWS_AT_ONCE])))
            release_pages(mapped)  # a mapped file is read through, not held
        if bad:
            raise DataError(f"{path}: {name} holds {bad} NaN or infinite values (in float32)")
    if arrays["x_train"].shape[1:] != arrays["x_test"].shape[1:]:
        raise DataError(f"{path}: x_train samples have shape {arrays['x_train'].shape[1:]}, x_test samples "
                        f"{arrays['x_test'].shape[1:]}; they must agree")
    labels = []
    for name in _SPLITS:
        y = arrays[f"y_{name}"]
        if y.ndim != 1 or len(y) != len(arrays[f"x_{name}"]):
            raise DataError(f"{path}: y_{name} must be one label per row of x_{name} ({len(arrays[f'x_{name}'])}), "
                            f"got shape {y.shape}")
        if y.dtype.kind == "f":
            if not np.all(np.isfinite(y)) or np.any(y != np.round(y)):
                raise DataError(f"{path}: y_{name} must hold integer labels")
        elif y.dtype.kind not in "iub":
            raise DataError(f"{path}: y_{name} must hold integer labels, got dtype {y.dtype}")
        if len(y) and (y.min() < 0 or y.max() > 100_000):
            raise DataError(f"{path}: labels span {y.min()}..{y.max()} in y_{name}, expected integers in 0..100000")
        labels.append(y.astype(np.int64))
    if not len(labels[0]):
        raise DataError(f"{path}: no training samples")
    every = np.concatenate(labels)
    found = int(every.max()) + 1
    num_classes = classes if classes is not None else max(found, 2)
    if every.min() < 0 or every.max() >= num_classes:
        raise DataError(f"{path}: labels span {every.min()}..{every.max()}, expected 0..{num_classes - 1}"
                        + ("" if classes is None else " (classes)"))
    sources = [arrays.get(f"source_{name}") for name in _SPLITS]
    if (sources[0] is None) != (sources[1] is None):
        raise DataError(f"{path}: give both source_train and source_test, or neither")
    if sources[0] is not None:
        for name, source in zip(_SPLITS, sources):
            if source.ndim != 1 or len(source) != len(labels[_SPLITS.index(name)]) or source.dtype.kind not in "iu":
                raise DataError(f"{path}: source_{name} must be one integer device id per sample")
    return Dataset("files", arrays["x_train"], labels[0], arrays["x_test"],
                   labels[1], num_classes=num_classes, mapped=mapped,
                   source_train=None if sources[0] is None else sources[0].astype(np.int64),
                   source_test=None if sources[1] is None else sources[1].astype(np.int64))


register(DatasetInfo("files", "your own dataset from a .npz or .parquet file (dataset: {name: files, path: FILE})",
                     load_files, FilesParams, images=None, inputs=lambda params, data_dir: [Path(params.path)],
                     hash_inputs=True))
