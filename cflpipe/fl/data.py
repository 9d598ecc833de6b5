"""Federated data: every client's train/test tensors on the training device, built once per run
from the dataset and the scenario's partition (its transforms applied here); in memory, or with
`training.client_store: disk` the inputs in file maps whose pages are let go after every round."""

from __future__ import annotations

import mmap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from cflpipe.data import load_dataset
from cflpipe.data.base import file_map, release_pages
from cflpipe.partition import (MIXED, PUBLIC_FILE, apply_sample_transforms, apply_transform, build_partition,
                               client_indices, client_sample_transforms, load_partition, realized_weights)
from cflpipe.errors import PartitionError
from cflpipe.partition_files import (  # noqa: F401  (partition_scenario, input_digests: their old home)
    DIGESTS, FINGERPRINT, PARTITION_FILES, _digest_problem, _fingerprint, input_digests, partition_scenario)
from cflpipe.spec import Spec

# Rows copied out of a file map between two releases of its pages (SplitData.take).
_ROWS_PER_RELEASE = 4096


@dataclass
class SplitData:
    """One split of every client, concatenated: client c owns rows offsets[c]:offsets[c+1]."""

    x: torch.Tensor
    y: torch.Tensor
    offsets: np.ndarray  # (clients + 1,)
    owner: torch.Tensor  # client of each row
    # The maps of a file `x` lives in (training.client_store: disk), else empty.
    mapped: tuple[mmap.mmap, ...] = field(default=(), repr=False, compare=False)

    def release_pages(self) -> None:
        """Let go of the pages of `x` this process has read (a file's: they stay in the file)."""
        release_pages(self.mapped)

    def of(self, client: int) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = self.offsets[client], self.offsets[client + 1]
        return self.x[a:b], self.y[a:b]

    def sizes(self) -> np.ndarray:
        return np.diff(self.offsets)

    def rows_of(self, clients: np.ndarray) -> torch.Tensor:
        """Row indices of the given clients' samples, client by client, on the data's device."""
        starts, lengths = self.offsets[clients], np.diff(self.offsets)[clients]
        within = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        return torch.from_numpy(np.repeat(starts, lengths) + within).to(self.y.device)

    def only(self, clients: np.ndarray) -> "SplitData":
        """The given (sorted) clients' rows (a copy) under their own numbers; every other client
        holds none."""
        rows = self.rows_of(clients)
        sizes = np.zeros(len(self.offsets) - 1, dtype=np.int64)
        sizes[clients] = np.diff(self.offsets)[clients]
        return SplitData(self.take(rows), self.y[rows], np.concatenate([[0], np.cumsum(sizes)]), self.owner[rows])

    def subset(self, clients: np.ndarray) -> "SplitData":
        """The given clients' rows (a copy), client by client, as clients 0..len(clients)-1."""
        rows = self.rows_of(clients)
        sizes = np.diff(self.offsets)[clients]
        owner = torch.from_numpy(np.repeat(np.arange(len(clients)), sizes)).to(self.owner.device)
        return SplitData(self.take(rows), self.y[rows], np.concatenate([[0], np.cumsum(sizes)]), owner)

    def take(self, rows: torch.Tensor) -> torch.Tensor:
        """x[rows], a copy. From a file map a block of rows at a time, the pages let go after each:
        a fault maps the page cache's whole folio around a row (up to megabytes of other clients'
        rows on ext4), so 1,000 sampled clients of 20,000 mapped 290 MB to copy 16 MB."""
        if not self.mapped:
            return self.x[rows]
        out = torch.empty((len(rows), *self.x.shape[1:]), dtype=self.x.dtype, device=self.x.device)
        for start in range(0, len(rows), _ROWS_PER_RELEASE):
            out[start:start + _ROWS_PER_RELEASE] = self.x[rows[start:start + _ROWS_PER_RELEASE]]
            self.release_pages()
        return out


@dataclass
class Move:
    """A client's move to another ground-truth group (scenario `drift`): from 1-based round
    `round` on, its rows of each split are `rows[split]` (inputs, labels under the new group's
    transform, the same samples)."""

    round: int
    client: int
    group: int
    transform: str
    rows: dict[str, tuple[torch.Tensor, torch.Tensor]]


@dataclass
class FederatedData:
    train: SplitData
    test: SplitData
    groups: np.ndarray  # ground-truth group per client, -1 where the scenario defines none
    num_classes: int
    input_shape: tuple[int, ...]
    transforms: list[str]
    # Inputs the server holds without labels (scenario `public:`), preprocessed as the clients'
    # inputs and untransformed (no group's rotation or label swap); None without `public:`.
    public: torch.Tensor | None = None
    # A mixture scenario's (clients × groups) shares of each group in each client's training
    # samples (partition.realized_weights; None: every client is one group's).
    mixture_weights: np.ndarray | None = None
    # Each client's validation split (scenario validation_fraction): never trained on, read by
    # evaluation for selection; None without one.
    val: SplitData | None = None
    # Scenario drift's moves in order, and how many of them the data holds now (`drift_to`).
    moves: tuple[Move, ...] = ()
    moved: int = 0

    def drift_to(self, round_number: int) -> list[Move]:
        """Apply the moves whose round is at most 1-based `round_number` and not applied yet, in
        place (every view of a client's rows sees its new data, `groups` its new group): before a
        round trains, and on resume for the rounds already trained. Returns the moves applied."""
        applied = []
        while self.moved < len(self.moves) and self.moves[self.moved].round <= round_number:
            move = self.moves[self.moved]
            for split, (x, y) in move.rows.items():
                data = getattr(self, split)
                a, b = data.offsets[move.client], data.offsets[move.client + 1]
                data.x[a:b], data.y[a:b] = x, y
            self.groups[move.client] = move.group
            self.transforms[move.client] = move.transform
            self.moved += 1
            applied.append(move)
        return applied

    @property
    def num_clients(self) -> int:
        return len(self.groups)

    @property
    def has_groups(self) -> bool:
        return bool((self.groups >= 0).all())

    @property
    def num_groups(self) -> int:
        return int(self.groups.max()) + 1 if self.has_groups else 0

    def release_pages(self) -> None:
        """Hand back the pages of the inputs kept in files (training.client_store: disk) that a
        round or an evaluation read: resident memory follows the clients a round touches."""
        for split in (self.train, self.test, self.val):
            if split is not None:
                split.release_pages()

    def client(self, c: int, split: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
        chosen = {"train": self.train, "test": self.test, "val": self.val}[split]
        if chosen is None:
            raise ValueError("this scenario has no validation split (scenario validation_fraction)")
        return chosen.of(c)

    def subset(self, clients: np.ndarray, train: bool = True) -> "FederatedData":
        """The given clients alone (their rows copied), numbered 0..len(clients)-1 in that order:
        what an evaluation of a client sample reads; without `train`, their training split is
        left empty (not copied)."""
        empty = SplitData(self.train.x[:0], self.train.y[:0], np.zeros(len(clients) + 1, dtype=np.int64),
                          self.train.owner[:0])
        return FederatedData(self.train.subset(clients) if train else empty, self.test.subset(clients),
                             self.groups[clients], self.num_classes, self.input_shape, self.transforms, self.public,
                             None if self.mixture_weights is None else self.mixture_weights[clients],
                             None if self.val is None else self.val.subset(clients))


# Bytes of the pool read at once by gather_pool_rows (its memory-mapped pages dropped after each).
_POOL_CHUNK_BYTES = 32 << 20


def gather_pool_rows(dataset, pool: str, rows: np.ndarray, out: np.ndarray,
                     out_maps: tuple[mmap.mmap, ...] = ()) -> None:
    """out[i] = the pool's row rows[i] (Dataset.pool_rows, written into out; rows in range, as
    build_federated_data checks), reading the pool once in order, a chunk of _POOL_CHUNK_BYTES
    at a time, the pages of a memory-mapped dataset dropped after each chunk. Gathering client
    by client instead reads all over the file, and each fault maps the pages around the row too
    (64 KB for a 12 KB CIFAR row): the process then held several times the rows it had read
    until a release. `out_maps`: the maps `out` lives in, let go with each chunk too."""
    order = np.argsort(rows, kind="stable")
    wanted = rows[order]
    splits = [(dataset.x_train, 0)]
    if pool != "train":
        splits.append((dataset.x_test, len(dataset.x_train)))
    for x, first in splits:
        chunk = max(1, _POOL_CHUNK_BYTES // max(x[:1].nbytes, 1))
        for start in range(0, len(x), chunk):
            stop = min(start + chunk, len(x))
            lo, hi = np.searchsorted(wanted, [first + start, first + stop])
            if hi > lo:
                out[order[lo:hi]] = x[wanted[lo:hi] - first]
                dataset.release_pages()
                release_pages(out_maps)


# Clients whose rows are written between two releases of the inputs' file maps.
_CLIENTS_PER_RELEASE = 4096


def build_federated_data(spec: Spec, scenario: str, device: torch.device, store: Path | None = None
                         ) -> FederatedData:
    """Read the partition written by `cflpipe partition` (building it first when absent, which
    gives the same bytes) and materialize every client's tensors once. `store`: a folder (the
    run's client store on disk) whose unlinked files hold the clients' inputs, mapped, their
    pages let go as they are written (the same bytes as in memory; labels stay in memory)."""
    sc = spec.scenarios[scenario]
    dataset = load_dataset(sc.dataset.name, sc.dataset.params, spec.data_dir)
    out = spec.partition_dir(scenario)
    if (out / "clients.parquet").exists():
        recorded = out / FINGERPRINT
        if not recorded.exists() or recorded.read_text() != _fingerprint(spec, scenario):
            raise PartitionError(f"{out}: built from a different definition of scenario {scenario}; "
                                 f"run `cflpipe partition --config FILE --scenario {scenario}` again")
        problem = _digest_problem(out)
        if problem is not None:
            raise PartitionError(f"{problem}; run `cflpipe partition --config FILE --scenario {scenario}` again")
        partition = load_partition(out)
    else:
        partition = build_partition(sc, dataset, where=f"scenarios.{scenario}")
    if sc.public is not None and partition.public is None:
        raise PartitionError(f"{out}: the partition has no {PUBLIC_FILE} although scenario {scenario} has "
                             f"`public:`; run `cflpipe partition --config FILE --scenario {scenario}` again")
    # Memory follows the data (#32 item 8): the split's one array is filled by reading the pool
    # once in order (a memory-mapped file is then held a chunk at a time), and each client's rows
    # are standardized and transformed there on their own: never a copy of the whole pool (the
    # concatenated pool, its standardized copy and per-client pieces held 4× the data).
    y_pool = dataset.pool_labels(sc.pool)
    standardize = _standardizer(dataset)
    dataset.release_pages()  # what the partition and the statistics read of a mapped file
    public = None
    if sc.public is not None:
        public = torch.from_numpy(np.ascontiguousarray(standardize(dataset.x_test[partition.public]),
                                                       dtype=np.float32)).to(device)
    indices = client_indices(partition)
    clients = sorted(indices)
    stats = partition.stats.set_index("client")
    groups = stats.loc[clients, "group"].to_numpy(dtype=np.int64)
    transforms = [str(t) for t in stats.loc[clients, "transform"]]
    per_sample = client_sample_transforms(partition) if MIXED in transforms else {}
    splits = {}
    with_val = bool((partition.clients["split"] == "val").any())
    for split in ("train", "test", "val")[:3 if with_val else 2]:
        rows = [np.asarray(indices[c][split], dtype=np.int64) for c in clients]
        every = np.concatenate(rows) if rows else np.empty(0, np.int64)
        if len(every) and (every.min() < 0 or every.max() >= len(y_pool)):
            raise PartitionError(f"{out}: the partition names pool samples {every.min()}..{every.max()}, but the "
                                 f"pool ({sc.pool}) has {len(y_pool)}; run `cflpipe partition` again")
        sizes = np.array([len(r) for r in rows], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(sizes)])
        shape = (int(offsets[-1]), *dataset.input_shape)
        maps: tuple[mmap.mmap, ...] = ()
        if store is None:
            x_all = np.empty(shape, dtype=np.float32)
        else:
            store.mkdir(parents=True, exist_ok=True)
            maps = (file_map(int(np.prod(shape)) * 4, store),)
            x_all = np.frombuffer(maps[0], dtype=np.float32, count=int(np.prod(shape))).reshape(shape)
        y_all = np.empty(int(offsets[-1]), dtype=np.int64)
        # A plugin's inputs in another precision are standardized in it before the cast, as ever.
        gathered = dataset.x_train.dtype == dataset.x_test.dtype == np.float32
        if gathered:
            gather_pool_rows(dataset, sc.pool, every, x_all, maps)
        for i, (idx, transform) in enumerate(zip(rows, transforms)):
            if maps and i % _CLIENTS_PER_RELEASE == 0:
                release_pages(maps)
            mine = slice(offsets[i], offsets[i + 1])
            inputs = x_all[mine] if gathered else dataset.pool_rows(sc.pool, idx)
            if transform == MIXED:
                x_all[mine], y_all[mine] = apply_sample_transforms(standardize(inputs), y_pool[idx],
                                                                   per_sample[clients[i]][split])
            else:
                x_all[mine], y_all[mine] = apply_transform(standardize(inputs), y_pool[idx], transform)
        splits[split] = SplitData(
            x=torch.from_numpy(x_all).to(device),
            y=torch.from_numpy(y_all).to(device),
            offsets=offsets,
            owner=torch.from_numpy(np.repeat(np.arange(len(clients)), sizes)).to(device),
            mapped=maps,
        )
        release_pages(maps)
    # A soft method's shares are estimated from the training samples: scored against those.
    realized = realized_weights(partition)
    weights = None if realized is None else realized[clients]
    moves = () if partition.moves is None else tuple(
        _move(row, {split: np.asarray(indices[row.client][split], dtype=np.int64) for split in splits},
              lambda idx, transform: apply_transform(standardize(dataset.pool_rows(sc.pool, idx)), y_pool[idx],
                                                     transform), device)
        for row in partition.moves.itertuples(index=False))
    return FederatedData(splits["train"], splits["test"], groups, partition.num_classes,
                         tuple(dataset.input_shape), transforms, public, weights, splits.get("val"), moves)


def _move(row, indices: dict[str, np.ndarray], transformed: Callable, device: torch.device) -> Move:
    """A client's rows of each split under the group it moves to (the partition's move `row`)."""
    rows = {}
    for split, idx in indices.items():
        x, y = transformed(idx, str(row.transform))
        rows[split] = (torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(device),
                       torch.from_numpy(np.asarray(y, dtype=np.int64)).to(device))
    return Move(int(row.round), int(row.client), int(row.group), str(row.transform), rows)


def _channel_std(x: np.ndarray, mean: np.ndarray, rows_at_once: int = 4096,
                 after_chunk: Callable[[], None] = lambda: None) -> np.ndarray:
    """Per-channel population std of (N, C, H, W) images around `mean` (1, C, 1, 1), float64,
    over chunks of rows: np.std holds a float64 copy of the whole array (twice the data)."""
    squares = np.zeros(x.shape[1], dtype=np.float64)
    for i in range(0, len(x), rows_at_once):
        deviation = x[i:i + rows_at_once] - mean
        squares += np.einsum("nchw,nchw->c", deviation, deviation)
        after_chunk()
    return np.sqrt(squares / max(x.shape[0] * x.shape[2] * x.shape[3], 1))


def _standardizer(dataset):
    """Per-channel standardization of images with the dataset's train-split statistics (the
    usual fixed MNIST/CIFAR constants, computed rather than hard-coded); transforms such as
    rotation keep these statistics, so order does not matter. Feature vectors stay as they are."""
    if not dataset.is_image:
        return lambda x: x
    mean = dataset.x_train.mean(axis=(0, 2, 3), dtype=np.float64)[None, :, None, None]
    dataset.release_pages()  # a mapped file's pages, read once for each statistic
    std = _channel_std(dataset.x_train, mean, after_chunk=dataset.release_pages)[None, :, None, None]
    # float32 statistics keep the arithmetic in float32 (no float64 copy of the pool).
    mean, std = mean.astype(np.float32), np.maximum(std, 1e-8).astype(np.float32)
    return lambda x: (x - mean) / std
