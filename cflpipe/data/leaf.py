"""LEAF's FEMNIST and CelebA with their natural clients (one per writer / celebrity).

Read from the per-user JSON files LEAF's preprocessing writes (`{"users": [...], "num_samples":
[...], "user_data": {user: {"x": [...], "y": [...]}}}`), placed in `<data_dir>/femnist/` or
`<data_dir>/celeba/` either as `all_data/*.json` (every sample; cflpipe splits each client's data
by the scenario's `test_fraction`) or as LEAF's own split `train/*.json` + `test/*.json` (used as
it is with `partition: [{kind: natural, holdout: dataset}]`; in LEAF's user-level split the
test files' users never train and are evaluated with the global model). FEMNIST's `x` rows are
784 floats (28×28, LEAF's scale); CelebA's `x` are image file names in `raw/img_align_celeba/` (or
`img_align_celeba/`), decoded with Pillow and resized to `size`×`size` as LEAF's model does.

Every sample's `source` is its user, so the `natural` partition gives one client per user; the
dataset's `users`/`select`/`seed` keep the first, the largest or a seeded random N users.
No official archive with a stable checksum exists for either (LEAF's scripts download from NIST
and Google Drive and preprocess), so `cflpipe download` says where to get and put the files.

Memory: each JSON file is parsed, turned into arrays user by user and dropped before the next
(a LEAF file holds ~100 writers), and the result is cached as `.npz` with a digest, so the Python
objects of one file at a time, not of the dataset, bound the peak.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from cflpipe.data.base import Dataset, DatasetInfo, register
from cflpipe.data.cache import load_cache, save_cache
from cflpipe.data.formats import to_float
from cflpipe.errors import DataError

LEAF_URL = "https://github.com/TalwalkarLab/leaf"
FEMNIST_CLASSES, CELEBA_CLASSES = 62, 2
FEMNIST_PIXELS = 28
# Bump when the parsed arrays change for the same files.
CACHE_VERSION = 1


class LeafParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    users: int | None = Field(None, ge=1, le=100_000, description="keep N users (default: all)")
    select: Literal["first", "largest", "random"] = Field(
        "first", description="which N users: in file order, with the most samples, or seeded random")
    seed: int = Field(0, ge=0, description="seed of select: random")


class CelebaParams(LeafParams):
    size: int = Field(84, ge=8, le=218, description="images resized to size×size (LEAF's CelebA model: 84)")


def manual_instructions(name: str, folder: Path) -> str:
    what = {"femnist": "data/femnist: ./preprocess.sh -s niid --sf 1.0 -k 0 -t sample",
            "celeba": "data/celeba: ./preprocess.sh -s niid --sf 1.0 -k 5 -t sample, which needs CelebA's "
                      "img_align_celeba/, list_attr_celeba.txt and identity_CelebA.txt (from the CelebA "
                      "authors) in data/raw/"}[name]
    return (f"{name}: no official archive with a stable checksum exists; run LEAF's preprocessing ({LEAF_URL}, "
            f"{what}) and copy its data/all_data/ folder (or data/train/ and data/test/)"
            + (" and data/raw/img_align_celeba/ as raw/img_align_celeba/" if name == "celeba" else "")
            + f" into {folder}/")


def _natural_order(path: Path) -> list:
    # all_data_2.json before all_data_10.json, as LEAF numbers its files
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path.name)]


def _json_files(folder: Path, name: str) -> tuple[list[Path], list[Path]]:
    train = sorted((folder / "train").glob("*.json"), key=_natural_order)
    test = sorted((folder / "test").glob("*.json"), key=_natural_order)
    if train and test:
        return train, test
    everything = sorted((folder / "all_data").glob("*.json"), key=_natural_order)
    if everything:
        return everything, []
    raise DataError(f"dataset {name} is not in {folder}: no LEAF JSON files in all_data/ or in train/ and "
                    f"test/. " + manual_instructions(name, folder))


def _read_users(path: Path) -> dict:
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: not a readable LEAF JSON file ({type(exc).__name__}: "
                        f"{' '.join(str(exc).split())[:120]})") from None
    if not isinstance(data, dict) or not isinstance(data.get("users"), list) \
            or not isinstance(data.get("user_data"), dict):
        raise DataError(f"{path}: a LEAF JSON file needs `users` (a list) and `user_data` (a mapping)")
    return data


class _Reader:
    """Turns one user's `x`/`y` into arrays, naming the file and user in every error."""

    def __init__(self, name: str, folder: Path, params: LeafParams):
        self.name, self.folder, self.params = name, folder, params
        self.classes = FEMNIST_CLASSES if name == "femnist" else CELEBA_CLASSES
        if name == "celeba":
            images = [folder / "raw" / "img_align_celeba", folder / "img_align_celeba"]
            self.images = next((d for d in images if d.is_dir()), images[0])

    def user(self, path: Path, user: str, record, expected: int | None) -> tuple[np.ndarray, np.ndarray]:
        where = f"{path}: user {user!r}"
        if not isinstance(record, dict) or "x" not in record or "y" not in record:
            raise DataError(f"{where}: needs `x` and `y`")
        xs, ys = record["x"], record["y"]
        if not isinstance(xs, list) or not isinstance(ys, list) or len(xs) != len(ys):
            raise DataError(f"{where}: `x` and `y` must be lists of the same length")
        if expected is not None and expected != len(ys):
            raise DataError(f"{where}: num_samples says {expected}, but it has {len(ys)} samples")
        try:
            y = np.asarray(ys, dtype=np.float64)
        except (TypeError, ValueError):
            raise DataError(f"{where}: labels must be numbers") from None
        if y.ndim != 1 or not np.all(np.isfinite(y)) or np.any(y != np.round(y)) \
                or (len(y) and (y.min() < 0 or y.max() >= self.classes)):
            raise DataError(f"{where}: labels must be integers in 0..{self.classes - 1}")
        # CelebA's images are decoded once the users are chosen (decode()): here only their names.
        x = self._femnist(where, xs) if self.name == "femnist" else self._names(where, xs)
        return x, y.astype(np.int64)

    def decode(self, where: str, x):
        return self._celeba(where, x) if self.name == "celeba" else x

    def _names(self, where: str, xs: list) -> list[str]:
        for name in xs:
            if not isinstance(name, str) or Path(name).name != name:
                raise DataError(f"{where}: x must be image file names, got {str(name)[:60]!r}")
        return xs

    def _femnist(self, where: str, xs: list) -> np.ndarray:
        try:
            x = np.asarray(xs, dtype=np.float32).reshape(len(xs), -1) if xs else np.empty((0, FEMNIST_PIXELS ** 2))
        except (TypeError, ValueError):
            raise DataError(f"{where}: every x must be a list of {FEMNIST_PIXELS ** 2} numbers") from None
        if x.ndim != 2 or x.shape[1] != FEMNIST_PIXELS ** 2:
            raise DataError(f"{where}: every x must be a list of {FEMNIST_PIXELS ** 2} numbers, got shape "
                            f"{tuple(x.shape)}")
        if not np.all(np.isfinite(x)):
            raise DataError(f"{where}: x holds NaN or infinite values")
        if len(x) and (x.min() < -1e-6 or x.max() > 1 + 1e-6):
            raise DataError(f"{where}: pixels must lie in [0, 1] (LEAF's scale), got {x.min():g}..{x.max():g}")
        # LEAF's FEMNIST pixels are floats in [0, 1]; stored as bytes (exact for k/255 values).
        return np.clip(np.rint(x * 255.0), 0, 255).astype(np.uint8).reshape(-1, 1, FEMNIST_PIXELS, FEMNIST_PIXELS)

    def _celeba(self, where: str, xs: list) -> np.ndarray:
        from PIL import Image, UnidentifiedImageError

        size = self.params.size  # type: ignore[attr-defined]
        out = np.empty((len(xs), 3, size, size), dtype=np.uint8)
        for i, name in enumerate(xs):
            path = self.images / name
            try:
                with Image.open(path) as image:
                    # Pillow's default filter (bicubic), as LEAF's CelebA model resizes
                    resized = image.convert("RGB").resize((size, size), Image.Resampling.BICUBIC)
            except FileNotFoundError:
                raise DataError(f"{path}: image of {where} is missing") from None
            except (OSError, UnidentifiedImageError) as exc:
                raise DataError(f"{path}: image of {where} cannot be decoded ({type(exc).__name__})") from None
            out[i] = np.asarray(resized, dtype=np.uint8).transpose(2, 0, 1)
        return out


def _parse(name: str, folder: Path, params: LeafParams, train_files: list[Path], test_files: list[Path]
           ) -> dict[str, np.ndarray]:
    reader = _Reader(name, folder, params)
    order: dict[str, int] = {}  # user → index in order of first appearance
    parts: dict[str, list] = {"train": [], "test": []}
    for split, files in (("train", train_files), ("test", test_files)):
        for path in files:
            data = _read_users(path)
            counts = data.get("num_samples")
            for i, user in enumerate(data["users"]):
                user = str(user)
                if user not in data["user_data"]:
                    raise DataError(f"{path}: user {user!r} is listed in `users` but has no `user_data`")
                expected = counts[i] if isinstance(counts, list) and i < len(counts) else None
                x, y = reader.user(path, user, data["user_data"][user], expected)
                if not len(y):
                    continue  # a user without samples is no client
                index = order.setdefault(user, len(order))
                parts[split].append((x, y, np.full(len(y), index, dtype=np.int64), f"{path}: user {user!r}"))
            del data
    if not order:
        raise DataError(f"{folder}: the LEAF files list no users")
    sizes = np.zeros(len(order), dtype=np.int64)
    for split in parts:
        for _, y, source, _ in parts[split]:
            sizes[source[0]] += len(y)
    keep = _select(params, sizes)
    remap = np.full(len(order), -1, dtype=np.int64)
    remap[keep] = np.arange(len(keep))
    arrays = {}
    shape = (3, params.size, params.size) if name == "celeba" else (1, FEMNIST_PIXELS, FEMNIST_PIXELS)  # type: ignore[attr-defined]
    for split in parts:
        chosen = [(reader.decode(where, x), y, s) for x, y, s, where in parts[split] if remap[s[0]] >= 0]
        arrays[f"x_{split}"] = np.concatenate([x for x, _, _ in chosen]) if chosen else np.empty((0, *shape), np.uint8)
        arrays[f"y_{split}"] = np.concatenate([y for _, y, _ in chosen]) if chosen else np.empty(0, np.int64)
        arrays[f"source_{split}"] = remap[np.concatenate([s for _, _, s in chosen])] if chosen \
            else np.empty(0, np.int64)
    return arrays


def _select(params: LeafParams, sizes: np.ndarray) -> np.ndarray:
    """Indices (ascending, i.e. in file order) of the users kept."""
    n = len(sizes)
    if params.users is None or params.users >= n:
        return np.arange(n)
    if params.select == "first":
        return np.arange(params.users)
    if params.select == "largest":
        return np.sort(np.argsort(-sizes, kind="stable")[:params.users])
    return np.sort(np.random.default_rng(params.seed).choice(n, size=params.users, replace=False))


def _stamp(files: list[Path], params: BaseModel) -> str:
    stats = [(str(f.relative_to(f.parent.parent)), f.stat().st_size, f.stat().st_mtime_ns) for f in files]
    return json.dumps({"version": CACHE_VERSION, "files": stats, "params": params.model_dump()}, sort_keys=True)


def load_leaf(name: str, params: LeafParams, data_dir: Path) -> Dataset:
    folder = Path(data_dir) / name
    train_files, test_files = _json_files(folder, name)
    stamp = _stamp(train_files + test_files, params)
    # Outside the dataset's folder (which the workflows track as the partition's input), one file
    # per dataset and parameters, replaced when the JSON files change.
    key = hashlib.sha256(json.dumps(params.model_dump(), sort_keys=True).encode()).hexdigest()[:16]
    cache = Path(data_dir) / ".cache" / f"{name}-{key}.npz"
    keys = ("stamp", "x_train", "y_train", "source_train", "x_test", "y_test", "source_test")
    arrays = load_cache(cache, keys)
    if arrays is None or str(arrays["stamp"]) != stamp:
        arrays = _parse(name, folder, params, train_files, test_files)
        save_cache(cache, stamp=np.array(stamp), **arrays)
    classes = FEMNIST_CLASSES if name == "femnist" else CELEBA_CLASSES
    return Dataset(name, to_float(arrays["x_train"]), arrays["y_train"], to_float(arrays["x_test"]),
                   arrays["y_test"], num_classes=classes, source_train=arrays["source_train"],
                   source_test=arrays["source_test"])


def _inputs(name: str):
    def inputs(params: BaseModel, data_dir: Path) -> list[Path]:
        folder = Path(data_dir) / name
        return sorted([*folder.glob("all_data/*.json"), *folder.glob("train/*.json"), *folder.glob("test/*.json")])
    return inputs


register(DatasetInfo("femnist", "LEAF FEMNIST: 28x28 handwritten characters, 62 classes, one client per writer "
                     "(LEAF's JSON files, placed by hand)", lambda p, d: load_leaf("femnist", p, d), LeafParams,
                     manual=manual_instructions, inputs=_inputs("femnist")))
register(DatasetInfo("celeba", "LEAF CelebA: face images (smiling or not), one client per celebrity (LEAF's JSON "
                     "files and img_align_celeba, placed by hand)", lambda p, d: load_leaf("celeba", p, d),
                     CelebaParams, manual=manual_instructions, inputs=_inputs("celeba")))
