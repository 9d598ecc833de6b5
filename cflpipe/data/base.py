"""The in-memory dataset every loader returns, and the registry of dataset names.

Loaders return numpy arrays (float32 inputs, int64 labels) so that the spec, the partitioner and
the downloader never need torch; the engine moves them to tensors once per run.
"""

from __future__ import annotations

import mmap
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
from pydantic import BaseModel, ConfigDict

from cflpipe.errors import DataError, SpecError


def release_pages(mappings: tuple[mmap.mmap, ...]) -> None:
    """Let this process drop the pages of memory maps it has read: they stay in the page cache
    and come back on the next read. Reading a mapped dataset through (the checks, the
    statistics, gathering clients' rows) then never holds all of it, so client tensors are built
    beside a few chunks of it rather than beside a copy (#32 item 8). Nothing where the platform
    has no madvise."""
    release = getattr(mmap, "MADV_DONTNEED", None)
    for mapping in mappings:
        if release is not None and hasattr(mapping, "madvise"):
            mapping.madvise(release)


def file_map(size: int, folder: Path | None = None) -> mmap.mmap:
    """A shared map of `size` bytes of an unlinked temporary file in `folder` (TMPDIR by default,
    which should be a disk: on a tmpfs the let-go pages stay in memory): its pages can be let go
    (the file holds them) and nothing is left on disk once the map is gone, whatever ends the
    process. The space is reserved first, so a full disk is an OSError here rather than a SIGBUS
    while the map is written."""
    where = Path(folder) if folder is not None else Path(tempfile.gettempdir())
    free = shutil.disk_usage(where).free
    if size > free:
        raise DataError(f"{where}: {size / 2**20:,.0f} MiB of data to map there, where {free / 2**20:,.0f} MiB are "
                        f"free; free space, or set TMPDIR (generated data) or training.client_store: memory")
    with tempfile.TemporaryFile(dir=folder) as backing:
        if hasattr(os, "posix_fallocate"):
            os.posix_fallocate(backing.fileno(), 0, max(size, 1))
        else:  # macOS, Windows: sparse
            backing.truncate(max(size, 1))
        return mmap.mmap(backing.fileno(), max(size, 1))


@dataclass(frozen=True)
class Dataset:
    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    # Generating device of each sample, for datasets that come naturally federated (LEAF
    # Synthetic); None elsewhere. Used by the `natural` partition.
    source_train: np.ndarray | None = None
    source_test: np.ndarray | None = None
    # Memory maps the inputs are read from (a `files` .npz stored uncompressed), else empty.
    mapped: tuple[mmap.mmap, ...] = field(default=(), repr=False, compare=False)

    def release_pages(self) -> None:
        release_pages(self.mapped)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])

    @property
    def is_image(self) -> bool:
        return self.x_train.ndim == 4

    def pool(self, which: str = "all") -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Inputs, labels and sources of the pool a partition draws from: the train split, or
        train followed by test ("all"). Pool index i is what clients.parquet calls `sample`."""
        if which == "train":
            return self.x_train, self.y_train, self.source_train
        if which != "all":
            raise ValueError(f"pool must be 'train' or 'all', got {which!r}")
        x = np.concatenate([self.x_train, self.x_test])
        y = np.concatenate([self.y_train, self.y_test])
        source = None
        if self.source_train is not None and self.source_test is not None:
            source = np.concatenate([self.source_train, self.source_test])
        return x, y, source

    def pool_rows(self, which: str, rows: np.ndarray) -> np.ndarray:
        """Inputs of the given pool indices, in their order, without building the pool (a copy of
        the whole dataset under "all")."""
        if which == "train":
            return self.x_train[rows]
        n = len(self.x_train)
        out = np.empty((len(rows), *self.x_train.shape[1:]), dtype=self.x_train.dtype)
        in_train = rows < n
        out[in_train] = self.x_train[rows[in_train]]
        out[~in_train] = self.x_test[rows[~in_train] - n]
        return out

    def pool_labels(self, which: str = "all") -> np.ndarray:
        if which == "train":
            return self.y_train
        return np.concatenate([self.y_train, self.y_test])


class NoParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


@dataclass(frozen=True)
class DatasetInfo:
    name: str
    description: str
    load: Callable[[BaseModel, Path], Dataset]
    params: type[BaseModel] = NoParams
    # Names of the files/resources fetched by `cflpipe download`; empty for embedded datasets.
    downloadable: bool = False
    aliases: tuple[str, ...] = field(default_factory=tuple)
    # Images (N, C, H, W) or feature vectors (N, D): decides which models fit, before any load
    # (None: known only once loaded, e.g. a user's own files).
    images: bool | None = True
    # Datasets placed by hand (no official archive with a stable checksum): manual(name, folder)
    # is the one line `cflpipe download` prints about where to get the files and where to put them.
    manual: Callable[[str, Path], str] | None = None
    # Files a scenario's partition reads (for the workflows' dependency tracking) when they are
    # neither downloaded nor embedded: inputs(params, data_dir) -> paths (a user's own file, LEAF's JSON).
    inputs: Callable[[BaseModel, Path], list[Path]] | None = None
    # Digest the inputs into the partition's fingerprint, so a partition of an edited file is not
    # trained on (small user files; LEAF's gigabytes are left to the workflows' mtime tracking).
    hash_inputs: bool = False
    # The rounds after which FedAvg's accuracy on it levels off at the usual training (measured;
    # None where not measured): `validate` warns when a scenario runs under half of it, and why.
    typical_rounds: int | None = None
    typical_rounds_evidence: str = ""


DATASETS: dict[str, DatasetInfo] = {}


def register(info: DatasetInfo) -> DatasetInfo:
    # A plugin registering a taken name would silently replace a dataset (and every result on it).
    old = DATASETS.get(info.name)
    if old is not None and old != info:
        raise ValueError(f"dataset name {info.name!r} is already registered; choose another name")
    DATASETS[info.name] = info
    return info


def dataset_info(name: str, field_path: str = "dataset") -> DatasetInfo:
    """The dataset a spec names: built in, an installed plugin's (entry point group
    `cflpipe.datasets`, pointing to a DatasetInfo or to a module that registers one) or a
    `module:ATTR` reference to a DatasetInfo; plugins are imported the first time they are named."""
    from cflpipe import data  # noqa: F401  (importing the package registers every dataset)
    from cflpipe.plugins import (DATASETS_GROUP, describe_object, entry_point_names, is_reference, load_entry_point,
                                 load_reference)

    if name in DATASETS:
        return DATASETS[name]
    if is_reference(name):
        info = load_reference(name, field_path)
        if not isinstance(info, DatasetInfo):
            raise SpecError(f"{field_path}: {name!r} is {describe_object(info)}, not a cflpipe.data.DatasetInfo")
        DATASETS[name] = info
        return info
    if name in entry_point_names(DATASETS_GROUP):
        obj = load_entry_point(DATASETS_GROUP, name, field_path)
        if isinstance(obj, DatasetInfo) and obj.name == name:
            register(obj)
        if name not in DATASETS:
            raise SpecError(f"{field_path}: entry point {name!r} of group {DATASETS_GROUP} gives no dataset of that "
                            f"name; point it to a cflpipe.data.DatasetInfo(name={name!r}, ...)")
        return DATASETS[name]
    allowed = ", ".join(sorted({*DATASETS, *entry_point_names(DATASETS_GROUP)} - {n for n in DATASETS if ":" in n}))
    raise SpecError(f"{field_path}: unknown dataset {name!r}; allowed: {allowed} (or a module:ATTR reference)")


def load_dataset(name: str, params: dict | BaseModel | None, data_dir: str | Path) -> Dataset:
    info = dataset_info(name)
    if not isinstance(params, BaseModel):
        params = info.params(**(params or {}))
    return info.load(params, Path(data_dir))
