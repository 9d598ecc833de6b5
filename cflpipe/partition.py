"""Seeded, composable client partitions of a dataset pool.

A scenario's `partition` list holds at most one label split (iid, dirichlet, pathological,
natural), at most one `quantity` step (client sizes), group transforms (rotation, label_swap,
flip; at most one of each kind) and at most one `mixture` step. The result is a table of
(client, split, sample) rows over the pool index of `Dataset.pool(scenario.pool)`, plus
per-client label statistics.

Several group transforms combine: every client draws one group of each (a cell of their
product, as many clients in every cell as can be), and its ground-truth group is the combination
of the groups of the transforms that define the truth (`ground_truth`, default true; FedRC's
feature shift beside a concept shift is a transform without it). A `mixture` step gives each
client weights over the cells ~ Dir(alpha) and each of its samples a cell in those proportions
(`component` column, the weights in stats.parquet); the client's ground-truth group is its
largest weight.

Group transforms are only *recorded* here (`transform` column, e.g. `rotate:90`); the engine
applies them when it builds a client's arrays, via `apply_transform` (or `client_arrays`).

Choices worth knowing:
- Randomness comes from `SeedSequence(scenario.seed)` spawned into one stream per role (sizes,
  split, groups, permutations, hold-out), so adding a rotation step does not change which
  samples a client gets, and the position of `quantity` in the list does not matter.
- `label_swap`: group 0 keeps the identity labelling, so one cluster matches the original
  dataset; every other group gets a distinct non-identity permutation (a random full
  permutation, or with `pairs: n` n disjoint swapped label pairs, as in Sattler et al.'s CFL).
- Every client gets at least one sample: a Dirichlet `min_size` of 0 is treated as 1.
- Hold-out: round(test_fraction·n) test samples (half to even, like Python's round), clamped to
  [1, n-1] when n >= 2 so both sides are non-empty; a one-sample client trains only.
- Transform string of a client without a group transform: "none" (group -1).

This module must not import torch.
"""

from __future__ import annotations


import io
import itertools
import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from cflpipe.data.base import Dataset
from cflpipe.errors import PartitionError
from cflpipe.spec import LABEL_SPLITS, Scenario
from cflpipe.store import read_parquet, write_bytes, write_parquet

NO_TRANSFORM = "none"
# A mixture client's transform in stats.parquet: each of its samples has its own (clients.parquet).
MIXED = "mixture"
# stats.parquet's columns of a mixture client's ground-truth group weights: weight_0, weight_1, …
WEIGHT_PREFIX = "weight_"
FILES = ("clients.parquet", "stats.parquet", "label_hist.png")
# One independent random stream per role; appending names keeps existing streams unchanged.
_STREAMS = ("sizes", "split", "groups", "permutations", "holdout", "public", "mixture")
# The server's public samples (scenario `public:`), when the scenario has them.
PUBLIC_FILE = "public.parquet"
# Up to 7 classes (5,040 permutations) the label_swap permutations are drawn from the full list.
_ENUMERATE_PERMUTATIONS_UP_TO = 7


@dataclass(frozen=True)
class Partition:
    """`clients`: one row per (client, sample) sorted by client, train before test, sample;
    columns client int32, split 'train'|'test', sample int64 (pool index), group int32 (the
    client's ground-truth group; -1 without one), transform str (the sample's: a mixture
    client's samples each have their own), label int64 (the label the client sees), and in a
    mixture scenario component int32 (the ground-truth group the sample was drawn from).
    `stats`: one row per client: client, group, transform (MIXED for a mixture client), n_train,
    n_test, label_0..label_{C-1}, and in a mixture scenario weight_0..weight_{G-1} (the drawn
    weights of the ground-truth groups)."""

    clients: pd.DataFrame
    stats: pd.DataFrame
    num_classes: int
    groups: int
    # Indices into the dataset's test split of the samples the server holds unlabeled (None: none).
    public: np.ndarray | None = None
    # A mixture scenario's (clients × ground-truth groups) weights each client's samples were
    # drawn with (None: every client is one group's).
    weights: np.ndarray | None = None

    @property
    def num_clients(self) -> int:
        return len(self.stats)

    def transform_of(self, client: int) -> str:
        return str(self.stats["transform"].iat[client])


# --------------------------------------------------------------------------- building


def build_partition(scenario: Scenario, dataset: Dataset, where: str = "scenario") -> Partition:
    """Partition `dataset`'s pool for `scenario`; `where` prefixes error messages (the YAML path of
    the scenario, e.g. `scenarios.dir01`). Raises PartitionError for impossible requests."""
    labels = np.asarray(dataset.pool_labels(scenario.pool), dtype=np.int64)
    num_classes = int(dataset.num_classes)
    pool_size = len(labels)
    clients = scenario.clients
    if pool_size and (labels.min() < 0 or labels.max() >= num_classes):
        raise PartitionError(f"{where}.dataset: labels of dataset {dataset.name} must lie in "
                             f"[0, {num_classes}), got {labels.min()}..{labels.max()}")
    rng = {name: np.random.default_rng(child)
           for name, child in zip(_STREAMS, np.random.SeedSequence(scenario.seed).spawn(len(_STREAMS)))}
    steps = {step.kind: (index, step) for index, step in enumerate(scenario.partition)}
    split_kind = next((kind for kind in LABEL_SPLITS if kind in steps), "iid")
    split_index, split_step = steps.get(split_kind, (None, None))

    # Validate the group transform and the public draw before the split work so a bad request
    # fails fast.
    group_plan = _plan_groups(scenario, dataset, num_classes, rng["permutations"], where)
    public = _public_samples(scenario, dataset, rng["public"], where)

    sizes = None
    if "quantity" in steps:
        sizes = _quantity_sizes(*steps["quantity"], clients, pool_size, rng["sizes"], where)
    elif split_kind != "natural" and clients > pool_size:
        raise PartitionError(f"{where}.clients: {clients} clients need at least 1 sample each, "
                             f"pool has {pool_size}")

    owner = np.full(pool_size, -1, dtype=np.int64)  # client of each pool sample, -1 if unused
    split_where = f"{where}.partition[{split_index}]"
    if split_kind == "iid":
        _split_iid(owner, clients, sizes, rng["split"])
    elif split_kind == "dirichlet":
        if sizes is None:
            _split_dirichlet_labelwise(owner, labels, num_classes, clients, split_step.alpha,
                                       max(split_step.min_size, 1), rng["split"], split_where)
        else:
            _check_min_size_vs_quantity(split_step, steps["quantity"], split_where, where)
            _split_dirichlet_clientwise(owner, labels, num_classes, sizes, split_step.alpha, rng["split"])
    elif split_kind == "pathological":
        _split_pathological(owner, labels, num_classes, clients, split_step.labels_per_client, sizes,
                            steps.get("quantity"), rng["split"], split_where, where, dataset.name,
                            split_step.label_sets)
    else:
        _split_natural(owner, _pool_sources(dataset, scenario.pool), clients, dataset.name,
                       split_where, where)

    sample = np.flatnonzero(owner >= 0)
    client = owner[sample]
    cell_of_client = _assign_cells(clients, group_plan, rng["groups"])
    mixture = scenario.step("mixture")
    weights, cell = None, cell_of_client[client]
    if group_plan is None:
        group_of_client, client_transform = cell_of_client, np.full(clients, NO_TRANSFORM, dtype=object)
    elif mixture is None:
        group_of_client = group_plan.truth[cell_of_client]
        client_transform = np.array(group_plan.transforms, dtype=object)[cell_of_client]
    else:
        cell, cell_weights = _mix_cells(client, clients, group_plan, mixture.alpha, rng["mixture"])
        weights = _truth_weights(cell_weights, group_plan) if group_plan.groups else None
        group_of_client = np.argmax(weights, axis=1) if weights is not None else np.full(clients, -1, np.int64)
        client_transform = np.full(clients, MIXED, dtype=object)
    seen = labels[sample]
    if group_plan is not None and group_plan.permutations is not None:
        seen = group_plan.permutations[cell, seen]
    sample_transform = None if mixture is None else np.array(group_plan.transforms, dtype=object)[cell]
    sample_group = None if mixture is None else group_plan.truth[cell]
    if split_kind == "natural" and split_step.holdout == "dataset":
        if not len(dataset.y_test):
            raise PartitionError(f"{split_where}.holdout: dataset {dataset.name} has no test split here (e.g. "
                                 f"LEAF's all_data/ only), so holdout: dataset would leave every client without "
                                 f"test data; use holdout: fraction")
        is_test = sample >= len(dataset.y_train)  # pool "all" is train followed by test
        # Users only in the test files (LEAF's user-level split) become clients that never train
        # and are evaluated with the run's one global model (the engine refuses methods without one).
        if is_test.all():
            raise PartitionError(f"{split_where}.holdout: with holdout: dataset, no client has a training "
                                 f"sample in {dataset.name}'s files; use holdout: fraction")
    else:
        is_test = _holdout(client, clients, scenario.test_fraction, rng["holdout"])
    partition = _assemble(client, sample, is_test, group_of_client, client_transform, seen, num_classes,
                          group_plan.groups if group_plan else 0, sample_transform, sample_group, weights)
    return replace(partition, public=public)


def _public_samples(scenario: Scenario, dataset: Dataset, rng: np.random.Generator, where: str) -> np.ndarray | None:
    """The server's unlabeled samples: `size` indices of the dataset's test split, drawn without
    replacement (sorted). Spec validation has made sure the clients' pool is the train split."""
    if scenario.public is None:
        return None
    available = len(dataset.y_test)
    size = available if scenario.public.size is None else scenario.public.size
    if size > available:
        raise PartitionError(f"{where}.public.size: must be <= {available} (the test split of dataset "
                             f"{dataset.name}), got {size}")
    return np.sort(rng.choice(available, size=size, replace=False)).astype(np.int64)


def _pool_sources(dataset: Dataset, which: str) -> np.ndarray | None:
    # Mirrors Dataset.pool without concatenating the inputs, which can be large.
    if which == "train":
        return dataset.source_train
    if dataset.source_train is None or dataset.source_test is None:
        return None
    return np.concatenate([dataset.source_train, dataset.source_test])


def _quantity_sizes(index: int, step, clients: int, pool_size: int, rng: np.random.Generator,
                    where: str) -> np.ndarray:
    field = f"{where}.partition[{index}]"
    needed = clients * step.min
    if needed > pool_size:
        raise PartitionError(f"{field}.min: {clients} clients × {step.min} samples needs {needed}, "
                             f"pool has {pool_size}")
    sizes = rng.integers(step.min, step.max, endpoint=True, size=clients).astype(np.int64)
    if sizes.sum() > pool_size:
        raise PartitionError(f"{field}.max: {clients} client sizes drawn from [{step.min}, {step.max}] "
                             f"need {int(sizes.sum())} samples, pool has {pool_size}; lower max")
    return sizes


def _label_pools(labels: np.ndarray, num_classes: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffled pool indices of each class."""
    shuffled = rng.permutation(len(labels))
    by_label = shuffled[np.argsort(labels[shuffled], kind="stable")]
    bounds = np.searchsorted(labels[by_label], np.arange(num_classes + 1))
    return [by_label[bounds[c]:bounds[c + 1]] for c in range(num_classes)]


def _assign_counts(owner: np.ndarray, pools: list[np.ndarray], counts: np.ndarray) -> None:
    """Give client i the next counts[i, c] samples of each class pool c (pools are shuffled)."""
    clients = np.arange(counts.shape[0])
    for c, pool in enumerate(pools):
        column = counts[:, c]
        total = int(column.sum())
        if total:
            owner[pool[:total]] = np.repeat(clients, column)


def _split_iid(owner: np.ndarray, clients: int, sizes: np.ndarray | None,
               rng: np.random.Generator) -> None:
    order = rng.permutation(len(owner))
    if sizes is None:
        owner[order] = np.arange(len(owner)) % clients
    else:
        owner[order[:sizes.sum()]] = np.repeat(np.arange(clients), sizes)


def _split_dirichlet_labelwise(owner: np.ndarray, labels: np.ndarray, num_classes: int, clients: int,
                               alpha: float, min_size: int, rng: np.random.Generator,
                               field: str) -> None:
    """Hsu et al. 2019: each class is split over the clients by proportions ~ Dir(alpha), then
    clients below min_size are topped up from the largest clients (no resampling loop)."""
    pool_size = len(labels)
    needed = clients * min_size
    if needed > pool_size:
        raise PartitionError(f"{field}.min_size: {clients} clients × {min_size} samples needs {needed}, "
                             f"pool has {pool_size}")
    pools = _label_pools(labels, num_classes, rng)
    class_sizes = np.array([len(p) for p in pools], dtype=np.int64)
    proportions = rng.dirichlet(np.full(clients, alpha), size=num_classes)
    bounds = np.floor(np.cumsum(proportions, axis=1) * class_sizes[:, None]).astype(np.int64)
    # Float round-off must neither lose the last samples nor make a boundary go backwards.
    bounds[:, -1] = class_sizes
    bounds = np.maximum.accumulate(np.minimum(bounds, class_sizes[:, None]), axis=1)
    counts = np.diff(bounds, axis=1, prepend=0).T  # clients × classes
    _assign_counts(owner, pools, counts)
    _repair_min_size(owner, clients, min_size, rng)


def _repair_min_size(owner: np.ndarray, clients: int, min_size: int, rng: np.random.Generator) -> None:
    """Move random samples from the largest clients to those below min_size.

    Donors are cut down water-filling style to the highest common level L >= min_size that frees
    the total deficit, so the repair is one vectorised pass and always terminates (the caller
    checked clients·min_size <= pool size, hence level min_size frees enough)."""
    sizes = np.bincount(owner[owner >= 0], minlength=clients)
    deficit = np.maximum(min_size - sizes, 0)
    total = int(deficit.sum())
    if total == 0:
        return

    def freed(level: int) -> int:
        return int(np.maximum(sizes - level, 0).sum())

    low, high = min_size, int(sizes.max())
    while low < high:  # highest level that still frees `total`
        mid = (low + high + 1) // 2
        if freed(mid) >= total:
            low = mid
        else:
            high = mid - 1
    take = np.maximum(sizes - (low + 1), 0)
    # freed(low + 1) < total <= freed(low): the rest comes one each from clients above `low`.
    rest = total - int(take.sum())
    take[np.flatnonzero(sizes > low)[:rest]] += 1

    used = np.flatnonzero(owner >= 0)
    by_owner = used[np.lexsort((rng.random(len(used)), owner[used]))]
    sorted_owner = owner[by_owner]
    rank = np.arange(len(by_owner)) - np.searchsorted(sorted_owner, np.arange(clients))[sorted_owner]
    donated = by_owner[rank < take[sorted_owner]]
    owner[donated] = np.repeat(np.arange(clients), deficit)


def _check_min_size_vs_quantity(step, quantity: tuple, field: str, where: str) -> None:
    # Only an explicit min_size conflicts; the default must not break quantity scenarios.
    q_index, q_step = quantity
    if "min_size" in step.model_fields_set and step.min_size > q_step.min:
        raise PartitionError(f"{field}.min_size: client sizes come from {where}.partition[{q_index}] "
                             f"(quantity min {q_step.min}), below min_size {step.min_size}; "
                             f"raise the quantity min or drop min_size")


def _split_dirichlet_clientwise(owner: np.ndarray, labels: np.ndarray, num_classes: int,
                                sizes: np.ndarray, alpha: float, rng: np.random.Generator) -> None:
    """Each client draws label proportions ~ Dir(alpha) and fills its size from the class pools;
    an exhausted class drops out and the client's proportions are renormalised over the rest.
    Each inner pass either fills the client or exhausts a class, so it runs <= classes+1 times;
    the caller checked sum(sizes) <= pool size, so every client fills."""
    pools = _label_pools(labels, num_classes, rng)
    remaining = np.array([len(p) for p in pools], dtype=np.int64)
    proportions = rng.dirichlet(np.full(num_classes, alpha), size=len(sizes))
    counts = np.zeros((len(sizes), num_classes), dtype=np.int64)
    # A random fill order, so no client id is systematically served from depleted pools.
    for i in rng.permutation(len(sizes)):
        need = int(sizes[i])
        p = proportions[i]
        while need > 0:
            p = np.where(remaining > 0, p, 0.0)
            mass = p.sum()
            # Tiny alpha can put all the mass on exhausted classes; fall back to what is left.
            p = p / mass if mass > 0 else remaining / remaining.sum()
            draw = np.minimum(rng.multinomial(need, p), remaining)
            counts[i] += draw
            remaining -= draw
            need -= int(draw.sum())
    _assign_counts(owner, pools, counts)


def _split_pathological(owner: np.ndarray, labels: np.ndarray, num_classes: int, clients: int,
                        per_client: int, sizes: np.ndarray | None, quantity: tuple | None,
                        rng: np.random.Generator, field: str, where: str, dataset_name: str,
                        label_sets: str = "cyclic") -> None:
    if per_client > num_classes:
        raise PartitionError(f"{field}.labels_per_client: must be <= the {num_classes} classes of "
                             f"dataset {dataset_name}, got {per_client}")
    if label_sets == "random":
        # Each client's L labels drawn uniformly without replacement: label sets repeat by chance
        # and a label may have no holder, whose samples then stay unused. (FedAvg's shards differ:
        # they use every sample, and a client's two shards may share a label.)
        held = np.argsort(rng.random((clients, num_classes)), axis=1)[:, :per_client]
        return _shard_pathological(owner, labels, num_classes, clients, held, sizes, quantity, rng, field, where)
    # Client i holds the L labels (start_i + j) mod C, distinct since L <= C. Starts floor(i·C/K)
    # are spread evenly round the circle, so any L consecutive starts are used by floor or
    # ceil(K·L/C) clients: every label has a balanced number of holders. Unlike shards of
    # consecutive labels, this yields up to C different label sets. Relabelling and shuffling the
    # clients randomise which client holds what.
    starts = np.arange(clients) * num_classes // clients
    slots = (starts[:, None] + np.arange(per_client)) % num_classes
    held = rng.permutation(num_classes)[slots][rng.permutation(clients)]  # clients × L
    _shard_pathological(owner, labels, num_classes, clients, held, sizes, quantity, rng, field, where)


def _shard_pathological(owner: np.ndarray, labels: np.ndarray, num_classes: int, clients: int, held: np.ndarray,
                        sizes: np.ndarray | None, quantity: tuple | None, rng: np.random.Generator, field: str,
                        where: str) -> None:
    """Deal each label's samples to the clients holding it (`held`: clients × L labels)."""
    holders = np.bincount(held.ravel(), minlength=num_classes)
    pools = _label_pools(labels, num_classes, rng)
    class_sizes = np.array([len(p) for p in pools], dtype=np.int64)
    short = np.flatnonzero(holders > class_sizes)
    if len(short):
        c = int(short[0])
        raise PartitionError(f"{field}.labels_per_client: label {c} has {class_sizes[c]} samples but "
                             f"{holders[c]} clients hold it; use fewer clients or labels_per_client")
    counts = np.zeros((clients, num_classes), dtype=np.int64)
    if sizes is None:
        # Equal shards of each label among its holders, in client order.
        for c in np.flatnonzero(holders):
            holding = np.flatnonzero((held == c).any(axis=1))
            h = len(holding)
            counts[holding, c] = class_sizes[c] // h + (np.arange(h) < class_sizes[c] % h)
    else:
        _fill_pathological(counts, held, sizes, class_sizes - holders, quantity, rng, field, where)
    _assign_counts(owner, pools, counts)


def _fill_pathological(counts: np.ndarray, held: np.ndarray, sizes: np.ndarray, spare_pool: np.ndarray,
                       quantity: tuple, rng: np.random.Generator, field: str, where: str) -> None:
    """Quantity sizes: client i takes sizes[i]/L of each of its labels, topping up from its other
    labels when one runs out. One sample per (client, label) slot is reserved up front, so every
    client keeps all L labels whatever order the clients fill in."""
    per_client = held.shape[1]
    q_index, q_step = quantity
    if q_step.min < per_client:
        raise PartitionError(f"{where}.partition[{q_index}].min: clients hold {per_client} labels each "
                             f"({field}.labels_per_client), so sizes must be >= {per_client}, "
                             f"got {q_step.min}")
    remaining = spare_pool.copy()  # samples beyond the reserved ones
    for i in rng.permutation(len(sizes)):
        mine = held[i]
        size = int(sizes[i])
        available = remaining[mine] + 1
        take = np.minimum(size // per_client + (np.arange(per_client) < size % per_client), available)
        missing = size - int(take.sum())
        while missing > 0:  # each pass fills the client or empties one of its labels
            spare = available - take
            if spare.sum() < missing:
                raise PartitionError(
                    f"{where}.partition[{q_index}].max: pathological clients draw only from their "
                    f"{per_client} label{'s' if per_client > 1 else ''}; a client of size {size} finds {int(available.sum())} "
                    f"samples left in its labels; lower max or use fewer clients")
            open_ = np.flatnonzero(spare > 0)
            share = missing // len(open_) + (np.arange(len(open_)) < missing % len(open_))
            extra = np.minimum(share, spare[open_])
            take[open_] += extra
            missing -= int(extra.sum())
        remaining[mine] -= take - 1
        counts[i, mine] = take


def _split_natural(owner: np.ndarray, sources: np.ndarray | None, clients: int, dataset_name: str,
                   field: str, where: str) -> None:
    if sources is None:
        raise PartitionError(f"{field}.kind: dataset {dataset_name} has no natural split (no generating "
                             f"device per sample); use iid, dirichlet or pathological")
    devices, owner[:] = np.unique(sources, return_inverse=True)
    if len(devices) != clients:
        raise PartitionError(f"{where}.clients: the natural split of dataset {dataset_name} has "
                             f"{len(devices)} devices, so clients must be {len(devices)}, got {clients}")


# --------------------------------------------------------------------------- groups


def _format_angle(angle: float) -> str:
    return str(int(angle)) if float(angle).is_integer() else repr(float(angle))


@dataclass(frozen=True)
class GroupPlan:
    """The scenario's groups: one cell per combination of its group transforms' groups (the first
    transform's group most significant; one transform: cell = its group), each with its transform
    string (the transforms' strings joined by "+"), label permutation (None without label_swap)
    and ground-truth group (the combination of the groups of the transforms with ground_truth,
    -1 where none has it)."""

    cells: int
    transforms: list[str]
    permutations: np.ndarray | None   # (cells × classes)
    truth: np.ndarray                 # (cells,) ground-truth group of each cell
    groups: int                       # ground-truth groups (0: none)


def _plan_groups(scenario: Scenario, dataset: Dataset, num_classes: int, rng: np.random.Generator,
                 where: str) -> GroupPlan | None:
    steps = scenario.group_steps()
    if not steps:
        return None
    plans = [_plan_step(step, num_classes, rng, f"{where}.partition[{scenario.partition.index(step)}]", dataset)
             for step in steps]
    sizes = [step.groups for step in steps]
    digits = np.array(list(itertools.product(*[range(n) for n in sizes])), dtype=np.int64).reshape(-1, len(steps))
    transforms = ["+".join(plans[k][0][g] for k, g in enumerate(row)) for row in digits]
    permutations = None
    for k, (_, step_permutations) in enumerate(plans):
        if step_permutations is not None:  # at most one label_swap step (spec validation)
            permutations = step_permutations[digits[:, k]]
    truth_steps = [k for k, step in enumerate(steps) if step.ground_truth]
    if truth_steps:
        truth = np.ravel_multi_index(tuple(digits[:, k] for k in truth_steps), [sizes[k] for k in truth_steps])
        groups = math.prod(sizes[k] for k in truth_steps)
    else:
        truth, groups = np.full(len(digits), -1, dtype=np.int64), 0
    return GroupPlan(len(digits), transforms, permutations, np.asarray(truth, dtype=np.int64), groups)


def _plan_step(step, num_classes: int, rng: np.random.Generator, field: str,
               dataset: Dataset) -> tuple[list[str], np.ndarray | None]:
    """One group transform's transform string per group and label permutation per group (None
    but for label_swap)."""
    if step.kind in ("rotation", "flip") and not dataset.is_image:
        raise PartitionError(f"{field}.kind: {step.kind} needs an image dataset; dataset {dataset.name} "
                             f"has inputs of shape {dataset.input_shape}; on feature vectors, groups by "
                             f"label_swap (a concept shift) work")
    if step.kind == "rotation":
        angles = step.group_angles()
        height, width = dataset.input_shape[-2:]
        odd = [a for a in angles if float(a / 90).is_integer() and int(a / 90) % 2]
        if height != width and odd:
            raise PartitionError(f"{field}.angles: rotating {height}x{width} images by {_format_angle(odd[0])} "
                                 f"changes their shape; use angles that are not odd multiples of 90")
        return [f"rotate:{_format_angle(a)}" for a in angles], None
    if step.kind == "flip":
        return [f"flip:{axis}" for axis in step.group_axes()], None
    if step.pairs is None:
        permutations = _label_permutations(num_classes, step.groups, rng, field, dataset.name)
    else:
        permutations = _pair_swaps(num_classes, step.groups, step.pairs, rng, field, dataset.name)
    return ["labels:" + "-".join(map(str, p)) for p in permutations], permutations


def _label_permutations(num_classes: int, groups: int, rng: np.random.Generator, field: str,
                        dataset_name: str) -> np.ndarray:
    available = math.factorial(num_classes)
    if groups > available:
        raise PartitionError(f"{field}.groups: dataset {dataset_name} has {num_classes} classes, so at most "
                             f"{available} distinct label permutations, got {groups}")
    identity = tuple(range(num_classes))
    if num_classes <= _ENUMERATE_PERMUTATIONS_UP_TO:
        others = list(itertools.permutations(identity))[1:]  # lexicographic: identity comes first
        chosen = [others[j] for j in rng.choice(len(others), size=groups - 1, replace=False)]
    else:
        # With >= 40,320 permutations a repeat is rare, so this loop ends after ~groups draws.
        seen = {identity}
        chosen = []
        while len(chosen) < groups - 1:
            candidate = tuple(int(v) for v in rng.permutation(num_classes))
            if candidate not in seen:
                seen.add(candidate)
                chosen.append(candidate)
    return np.array([identity, *chosen], dtype=np.int64).reshape(groups, num_classes)


def _pair_swaps(num_classes: int, groups: int, pairs: int, rng: np.random.Generator, field: str,
                dataset_name: str) -> np.ndarray:
    """Identity for group 0; every other group swaps `pairs` disjoint label pairs, drawn at random
    and distinct across groups (Sattler et al.'s CFL label swap)."""
    if 2 * pairs > num_classes:
        raise PartitionError(f"{field}.pairs: dataset {dataset_name} has {num_classes} classes, so at most "
                             f"{num_classes // 2} disjoint label pairs, got {pairs}")
    # Permutations made of exactly `pairs` disjoint transpositions: C! / (2^p · p! · (C − 2p)!).
    available = math.factorial(num_classes) // (2 ** pairs * math.factorial(pairs)
                                                * math.factorial(num_classes - 2 * pairs))
    if groups - 1 > available:
        raise PartitionError(f"{field}.groups: with {pairs} swapped pair(s) of {num_classes} classes there are "
                             f"{available} distinct swaps, so at most {available + 1} groups, got {groups}")
    identity = tuple(range(num_classes))
    seen, chosen = {identity}, []
    while len(chosen) < groups - 1:  # few draws: groups − 1 is small next to `available`, or a rejection
        labels = rng.permutation(num_classes)[:2 * pairs]
        permutation = list(identity)
        for a, b in zip(labels[0::2], labels[1::2]):
            permutation[a], permutation[b] = int(b), int(a)
        if tuple(permutation) not in seen:
            seen.add(tuple(permutation))
            chosen.append(tuple(permutation))
    return np.array([identity, *chosen], dtype=np.int64).reshape(groups, num_classes)


def _assign_cells(clients: int, plan: GroupPlan | None, rng: np.random.Generator) -> np.ndarray:
    """Each client's cell (-1 without group transforms): as many clients in every cell as can be."""
    if plan is None:
        return np.full(clients, -1, dtype=np.int64)
    cell = np.empty(clients, dtype=np.int64)
    cell[rng.permutation(clients)] = np.arange(clients) % plan.cells
    return cell


def _mix_cells(client: np.ndarray, clients: int, plan: GroupPlan, alpha: float,
               rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """The mixture step: each client draws weights over the cells ~ Dir(alpha); its samples (all
    of them, before the hold-out, so that both splits mix alike) take cell c in round(w_c·n)
    of its n samples (largest remainders: the counts sum to n and each is within 1 of w_c·n),
    at random. Returns every sample's cell and the (clients × cells) weights."""
    weights = rng.dirichlet(np.full(plan.cells, alpha), size=clients)
    sizes = np.bincount(client, minlength=clients)
    exact = weights * sizes[:, None]
    counts = np.floor(exact).astype(np.int64)
    short = sizes - counts.sum(axis=1)
    # Largest remainders first (ties: the lower cell), so the counts add up to each client's size.
    order = np.argsort(-(exact - counts), axis=1, kind="stable")
    ranks = np.empty_like(order)
    np.put_along_axis(ranks, order, np.arange(plan.cells)[None, :].repeat(clients, 0), axis=1)
    counts += ranks < short[:, None]
    by_client = np.lexsort((rng.random(len(client)), client))
    cells = np.empty(len(client), dtype=np.int64)
    cells[by_client] = np.concatenate([np.repeat(np.arange(plan.cells), counts[c]) for c in range(clients)]) \
        if clients else np.empty(0, dtype=np.int64)
    return cells, weights


def _truth_weights(weights: np.ndarray, plan: GroupPlan) -> np.ndarray:
    """(clients × ground-truth groups) weights: the cells' weights summed by their group."""
    out = np.zeros((len(weights), plan.groups))
    np.add.at(out.T, plan.truth, weights.T)
    return out


# --------------------------------------------------------------------------- hold-out and tables


def _holdout(client: np.ndarray, clients: int, test_fraction: float, rng: np.random.Generator) -> np.ndarray:
    n = np.bincount(client, minlength=clients)
    n_test = np.where(n >= 2, np.clip(np.rint(test_fraction * n).astype(np.int64), 1, n - 1), 0)
    order = np.lexsort((rng.random(len(client)), client))
    sorted_client = client[order]
    rank = np.arange(len(order)) - np.searchsorted(sorted_client, np.arange(clients))[sorted_client]
    is_test = np.empty(len(client), dtype=bool)
    is_test[order] = rank < n_test[sorted_client]
    return is_test


def _assemble(client, sample, is_test, group_of_client, client_transform, seen, num_classes, groups,
              sample_transform=None, sample_group=None, weights=None) -> Partition:
    clients = len(group_of_client)
    empty = np.flatnonzero(np.bincount(client, minlength=clients) == 0)
    if len(empty):  # the splits guarantee >= 1 sample per client; this guards against regressions
        raise AssertionError(f"partition left client {int(empty[0])} without samples")
    order = np.lexsort((sample, is_test, client))
    c = client[order]
    columns = {
        "client": c.astype(np.int32),
        "split": np.where(is_test[order], "test", "train").astype(object),
        "sample": sample[order].astype(np.int64),
        "group": group_of_client[c].astype(np.int32),
        "transform": client_transform[c] if sample_transform is None else sample_transform[order],
        "label": seen[order].astype(np.int64),
    }
    if sample_group is not None:  # a mixture: the ground-truth group each sample was drawn from
        columns["component"] = sample_group[order].astype(np.int32)
    table = pd.DataFrame(columns)
    label_counts = np.bincount(client * num_classes + seen, minlength=clients * num_classes)
    label_counts = label_counts.reshape(clients, num_classes)
    n_test = np.bincount(client[is_test], minlength=clients)
    stats = {
        "client": np.arange(clients, dtype=np.int32),
        "group": group_of_client.astype(np.int32),
        "transform": client_transform,
        "n_train": (label_counts.sum(axis=1) - n_test).astype(np.int64),
        "n_test": n_test.astype(np.int64),
    }
    stats.update({f"label_{k}": label_counts[:, k].astype(np.int64) for k in range(num_classes)})
    if weights is not None:
        stats.update({f"{WEIGHT_PREFIX}{g}": weights[:, g].astype(np.float64) for g in range(weights.shape[1])})
    return Partition(table, pd.DataFrame(stats), num_classes, int(groups), weights=weights)


# --------------------------------------------------------------------------- files


# Fewer test samples than this make a client's accuracy coarse (steps of over 10 %): said when
# the partition is written and in the report's scenario overview.
SMALL_TEST_SET = 10


def small_test_sets(stats: pd.DataFrame, minimum: int = SMALL_TEST_SET) -> str | None:
    """One line when some clients hold fewer than `minimum` test samples, else None. In a
    user-level split (some clients never train) the training clients hold no test samples by
    design and are left out."""
    n_test = stats["n_test"].to_numpy()
    if "n_train" in stats and (stats["n_train"].to_numpy() == 0).any():
        n_test = n_test[stats["n_train"].to_numpy() == 0]
    small = n_test < minimum
    if not small.any():
        return None
    fewest = int(n_test.min())
    step = f", one sample is {100 / fewest:.0f} % of that client's accuracy" if fewest else \
        " (no accuracy at all for that client)"
    return (f"{int(small.sum())} of {len(n_test)} clients have fewer than {minimum} test samples (fewest: "
            f"{fewest}{step}); their per-client accuracies are coarse. More data per client (test_fraction, "
            f"dirichlet min_size, quantity min) gives finer ones")


def write_partition(partition: Partition, out_dir: str | Path, title: str | None = None) -> None:
    """Write clients.parquet, stats.parquet and label_hist.png. Everything is prepared in memory
    first and each file is renamed into place, so an error leaves no new or half-written file."""
    out = Path(out_dir)
    clients = pa.Table.from_pandas(partition.clients, preserve_index=False)
    stats = pa.Table.from_pandas(partition.stats, preserve_index=False)
    png = label_heatmap_png(partition, title)
    public = None if partition.public is None else \
        pa.Table.from_pandas(pd.DataFrame({"sample": partition.public}), preserve_index=False)
    write_parquet(out / "clients.parquet", clients)
    write_parquet(out / "stats.parquet", stats)
    write_bytes(out / "label_hist.png", png)
    if public is not None:
        write_parquet(out / PUBLIC_FILE, public)
    elif (out / PUBLIC_FILE).exists():
        (out / PUBLIC_FILE).unlink()  # left over from an earlier definition of the scenario


def load_partition(out_dir: str | Path) -> Partition:
    out = Path(out_dir)
    for name in FILES[:2]:
        if not (out / name).is_file():
            raise PartitionError(f"{out / name}: partition file is missing; run the partition step first")
    clients = read_parquet(out / "clients.parquet")
    stats = read_parquet(out / "stats.parquet")
    num_classes = sum(1 for column in stats.columns if column.startswith("label_"))
    top_group = int(stats["group"].max()) if len(stats) else -1
    public = None
    if (out / PUBLIC_FILE).is_file():
        public = read_parquet(out / PUBLIC_FILE)["sample"].to_numpy(np.int64)
    weight_columns = [column for column in stats.columns if column.startswith(WEIGHT_PREFIX)]
    weights = stats[weight_columns].to_numpy(np.float64) if weight_columns else None
    groups = len(weight_columns) if weight_columns else top_group + 1
    return Partition(clients, stats, num_classes, groups, public, weights)


# A picture for people (mutation testing leaves it out: no figure a run computes depends on it).
def label_heatmap_png(partition: Partition, title: str | None = None) -> bytes:  # pragma: no mutate block
    # The object API with an explicit Agg canvas avoids pyplot's global state and backend choice.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    stats = partition.stats.sort_values(["group", "client"], kind="stable")
    counts = stats[[f"label_{k}" for k in range(partition.num_classes)]].to_numpy()
    figure = Figure(figsize=(7, 6), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    image = axes.imshow(counts, aspect="auto", interpolation="nearest", cmap="viridis")
    figure.colorbar(image, ax=axes, label="samples (train + test)")
    groups = stats["group"].to_numpy()
    for boundary in np.flatnonzero(np.diff(groups)):
        axes.axhline(boundary + 0.5, color="white", linewidth=0.8)
    if len(stats) <= 40:
        axes.set_yticks(np.arange(len(stats)), [str(c) for c in stats["client"]], fontsize=6)
    if partition.num_classes <= 20:
        axes.set_xticks(np.arange(partition.num_classes))
    axes.set_xlabel("label seen by the client")
    axes.set_ylabel("client (sorted by group)" if partition.groups else "client")
    groups_text = f", {partition.groups} groups" if partition.groups else ""
    axes.set_title(title or f"Label counts per client ({partition.num_clients} clients, "
                            f"{partition.num_classes} classes{groups_text})")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", metadata={"Software": None})
    return buffer.getvalue()


# --------------------------------------------------------------------------- use by the engine


def client_indices(partition: Partition) -> dict[int, dict[str, np.ndarray]]:
    """client → {'train': pool indices, 'test': pool indices}, each ascending."""
    return _per_client_split(partition, "sample")


def _per_client_split(partition: Partition, column: str) -> dict[int, dict[str, np.ndarray]]:
    """client → {'train': …, 'test': …} of clients.parquet's `column`, rows in ascending sample."""
    table = partition.clients
    key = table["client"].to_numpy(np.int64) * 2 + (table["split"] == "test").to_numpy()
    order = np.lexsort((table["sample"].to_numpy(np.int64), key))
    key, values = key[order], table[column].to_numpy()[order]
    bounds = np.searchsorted(key, np.arange(2 * partition.num_clients + 1))
    return {k: {"train": values[bounds[2 * k]:bounds[2 * k + 1]], "test": values[bounds[2 * k + 1]:bounds[2 * k + 2]]}
            for k in range(partition.num_clients)}


def client_transforms(partition: Partition) -> dict[int, str]:
    """client → its transform; a mixture client's is MIXED (see client_sample_transforms)."""
    return dict(zip(partition.stats["client"].astype(int), partition.stats["transform"].astype(str)))


def realized_weights(partition: Partition, split: str = "train") -> np.ndarray | None:
    """A mixture scenario's (clients × ground-truth groups) shares of each group in each client's
    `split`, as its samples fell (the drawn weights, rounded to whole samples and then split at
    random by the hold-out); the drawn weights for a client with no sample there. None without
    a mixture."""
    if partition.weights is None or "component" not in partition.clients:
        return None
    rows = partition.clients[partition.clients["split"] == split]
    counts = np.zeros_like(partition.weights)
    np.add.at(counts, (rows["client"].to_numpy(np.int64), rows["component"].to_numpy(np.int64)), 1.0)
    sizes = counts.sum(axis=1, keepdims=True)
    return np.where(sizes > 0, counts / np.maximum(sizes, 1.0), partition.weights)


def client_sample_transforms(partition: Partition) -> dict[int, dict[str, np.ndarray]]:
    """client → {'train': transform of each sample, 'test': …}, in client_indices' order (by
    sample): a mixture client's samples each have their own."""
    return _per_client_split(partition, "transform")


def apply_sample_transforms(x: np.ndarray, y: np.ndarray, transforms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """apply_transform row by row, one call per distinct transform (a mixture client's rows)."""
    x_out, y_out = np.empty_like(x), np.asarray(y, dtype=np.int64).copy()
    for transform in dict.fromkeys(transforms):
        rows = np.flatnonzero(transforms == transform)
        x_out[rows], y_out[rows] = apply_transform(x[rows], y_out[rows], str(transform))
    return x_out, y_out


def client_arrays(partition: Partition, x: np.ndarray, y: np.ndarray
                  ) -> dict[int, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """client → {'train': (x, y), 'test': (x, y)} with the client's transform (a mixture client's:
    each sample's) applied; `x`, `y` are the pool arrays of `Dataset.pool(scenario.pool)`. The
    labels equal the `label` column."""
    transforms = client_transforms(partition)
    per_sample = client_sample_transforms(partition)
    return {k: {split: (apply_transform(x[idx], y[idx], transforms[k]) if transforms[k] != MIXED
                        else apply_sample_transforms(x[idx], y[idx], per_sample[k][split]))
                for split, idx in parts.items()}
            for k, parts in client_indices(partition).items()}


def apply_transform(x: np.ndarray, y: np.ndarray, transform: str) -> tuple[np.ndarray, np.ndarray]:
    """Apply a recorded transform to a batch: x is (N, C, H, W) for image transforms (the last two
    axes are rotated/flipped), y holds original labels. Returns C-contiguous arrays (torch cannot
    wrap the negative strides of np.rot90/np.flip views)."""
    if transform in (NO_TRANSFORM, ""):
        return x, y
    if "+" in transform:  # several group transforms, applied in the scenario's order
        for part in transform.split("+"):
            x, y = apply_transform(x, y, part)
        return x, y
    kind, _, value = transform.partition(":")
    if kind == "rotate":
        angle = float(value) % 360.0
        if float(angle / 90.0).is_integer():
            turned = np.rot90(x, int(angle // 90), axes=(-2, -1))
        else:
            from scipy import ndimage

            # axes=(-2, -1) turns the same way as np.rot90, so 45° is half of rotate:90.
            # grid-constant pads with zeros *before* interpolating; plain constant would blank
            # edge pixels that float error puts a hair outside the image.
            turned = ndimage.rotate(x, angle, axes=(-2, -1), reshape=False, order=1,
                                    mode="grid-constant", cval=0.0)
        return np.ascontiguousarray(turned, dtype=x.dtype), y
    if kind == "flip":
        axes = {"none": (), "horizontal": (-1,), "vertical": (-2,), "both": (-2, -1)}.get(value)
        if axes is None:
            raise ValueError(f"unknown flip axis {value!r} in transform {transform!r}")
        return (np.ascontiguousarray(np.flip(x, axes)) if axes else x), y
    if kind == "labels":
        permutation = np.array([int(v) for v in value.split("-")], dtype=np.int64)
        return x, permutation[np.asarray(y, dtype=np.int64)]
    raise ValueError(f"unknown transform {transform!r}")
