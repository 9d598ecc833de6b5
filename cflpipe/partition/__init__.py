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
largest weight. A scenario's `drift` events move a seeded share of the clients to another
ground-truth group from a given round on (`moves`, drift.parquet); the engine applies them.

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
- Validation (`validation_fraction` > 0): of the training samples left after the hold-out,
  round(validation_fraction·n_train), clamped the same way, become the client's `val` split, by
  a stream of their own (the test split is the one without validation). Recorded in the
  partition, so every method and seed of the scenario selects on the same samples.
- Transform string of a client without a group transform: "none" (group -1).

Layout: `splits` (label splits and sizes), `groups` (group transforms and mixtures), `files`
(the partition's files), `arrays` (a partition in use by the engine), `base` (`Partition`); the
building is here. Import from the package.

This package must not import torch.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pyarrow as pa

from cflpipe.data.base import Dataset
from cflpipe.errors import PartitionError
from cflpipe.spec import LABEL_SPLITS, Scenario
from cflpipe.partition.arrays import (client_indices, client_transforms, realized_weights, client_sample_transforms,
                                      apply_sample_transforms, client_arrays, apply_transform)
from cflpipe.partition.base import DRIFT_FILE, FILES, MIXED, NO_TRANSFORM, PUBLIC_FILE, SPLITS, WEIGHT_PREFIX, Partition
from cflpipe.partition.files import (SMALL_TEST_SET, small_test_sets, small_validation_sets, write_partition,
                                     load_partition,
                                     label_heatmap_png)
from cflpipe.partition.groups import _plan_groups, _assign_cells, _mix_cells, _plan_drift, _truth_weights
from cflpipe.partition.splits import (_quantity_sizes, _split_iid, _split_dirichlet_labelwise,
                                      _check_min_size_vs_quantity, _split_dirichlet_clientwise, _split_pathological,
                                      _split_natural)

# One independent random stream per role; appending names keeps existing streams unchanged.
_STREAMS = ("sizes", "split", "groups", "permutations", "holdout", "public", "mixture", "validation", "drift")

__all__ = [
    "DRIFT_FILE", "FILES", "MIXED", "NO_TRANSFORM", "PUBLIC_FILE", "Partition", "SMALL_TEST_SET", "WEIGHT_PREFIX",
    "apply_sample_transforms", "apply_transform", "build_partition", "client_arrays", "client_indices",
    "client_sample_transforms", "client_transforms", "label_heatmap_png", "load_partition", "realized_weights",
    "small_test_sets", "small_validation_sets", "write_partition",
]


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
    is_val = None
    if scenario.validation_fraction > 0:
        is_val = np.zeros(len(client), dtype=bool)
        trains = np.flatnonzero(~is_test)
        is_val[trains] = _holdout(client[trains], clients, scenario.validation_fraction, rng["validation"])
    partition = _assemble(client, sample, is_test, group_of_client, client_transform, seen, num_classes,
                          group_plan.groups if group_plan else 0, sample_transform, sample_group, weights, is_val)
    moves = None if scenario.drift is None else _plan_drift(scenario, group_plan, cell_of_client, rng["drift"])
    return replace(partition, public=public, moves=moves)


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


def _coded(values: np.ndarray, take: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """values[take] as (codes, distinct values), without an object array of every row."""
    distinct, inverse = np.unique(values, return_inverse=True)
    return inverse.astype(np.int32)[take], distinct


# The dtype pandas gives a column of strings: Arrow-backed from pandas 3, object before.
_STRING_DTYPE = pd.Series(["x"]).dtype


def _strings(codes: np.ndarray, values: np.ndarray):
    """A string column decoded from codes into values, of the dtype pandas would infer (so the
    table and its Parquet bytes are as before). From pandas 3 straight into Arrow strings: an
    object array of 6.7 M rows and pandas' inference over it peaked at about 300 MB."""
    if _STRING_DTYPE == np.dtype(object):
        return values[codes]
    decoded = pa.DictionaryArray.from_arrays(pa.array(codes), pa.array(values.tolist(), pa.string()))
    return pd.array(decoded.cast(pa.large_string()), dtype=_STRING_DTYPE)


def _assemble(client, sample, is_test, group_of_client, client_transform, seen, num_classes, groups,
              sample_transform=None, sample_group=None, weights=None, is_val=None) -> Partition:
    clients = len(group_of_client)
    empty = np.flatnonzero(np.bincount(client, minlength=clients) == 0)
    if len(empty):  # the splits guarantee >= 1 sample per client; this guards against regressions
        raise AssertionError(f"partition left client {int(empty[0])} without samples")
    # Rows by client, then train, test, val (SPLITS' order), then sample. The samples come in
    # ascending order (the builders' flatnonzero), so a stable sort on (client, split) is that
    # order; each column is gathered once and the table keeps the arrays (no copy into blocks):
    # at 100,000 LEAF Synthetic devices (6.7 M rows) the sort keys, the gathered int64 copies
    # and the block copy held about 850 MB at once.
    assert len(sample) < 2 or bool((np.diff(sample) > 0).all()), "samples must come in ascending order"
    code = is_test.astype(np.int8) if is_val is None else np.where(is_val, 2, is_test).astype(np.int8)
    order = np.argsort(client * len(SPLITS) + code, kind="stable")
    c = client.astype(np.int32)[order]
    columns = {
        "client": c,
        "split": _strings(code[order], np.asarray(SPLITS, dtype=object)),
        "sample": sample[order].astype(np.int64, copy=False),
        "group": group_of_client.astype(np.int32)[c],
        "transform": _strings(*_coded(client_transform, c) if sample_transform is None else
                              _coded(sample_transform, order)),
        "label": seen[order].astype(np.int64, copy=False),
    }
    if sample_group is not None:  # a mixture: the ground-truth group each sample was drawn from
        columns["component"] = sample_group[order].astype(np.int32)
    del order
    table = pd.DataFrame(columns, copy=False)
    label_counts = np.bincount(client * num_classes + seen, minlength=clients * num_classes)
    label_counts = label_counts.reshape(clients, num_classes)
    n_test = np.bincount(client[is_test], minlength=clients)
    n_val = np.bincount(client[is_val], minlength=clients) if is_val is not None else np.zeros(clients, np.int64)
    stats = {
        "client": np.arange(clients, dtype=np.int32),
        "group": group_of_client.astype(np.int32),
        "transform": client_transform,
        "n_train": (label_counts.sum(axis=1) - n_test - n_val).astype(np.int64),
        "n_test": n_test.astype(np.int64),
    }
    if is_val is not None:  # a column only where there is a validation split: older partitions keep their bytes
        stats["n_val"] = n_val.astype(np.int64)
    stats.update({f"label_{k}": label_counts[:, k].astype(np.int64) for k in range(num_classes)})
    if weights is not None:
        stats.update({f"{WEIGHT_PREFIX}{g}": weights[:, g].astype(np.float64) for g in range(weights.shape[1])})
    return Partition(table, pd.DataFrame(stats), num_classes, int(groups), weights=weights)
