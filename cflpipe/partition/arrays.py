"""A partition in use by the engine: each client's indices, transforms and arrays, with the
recorded transforms applied."""
from __future__ import annotations

import numpy as np

from cflpipe.partition.base import NO_TRANSFORM, MIXED, SPLITS, Partition


# --------------------------------------------------------------------------- use by the engine


def client_indices(partition: Partition) -> dict[int, dict[str, np.ndarray]]:
    """client → {'train': pool indices, 'test': …, 'val': …}, each ascending ('val' empty
    without a validation split)."""
    return _per_client_split(partition, "sample")


def _per_client_split(partition: Partition, column: str) -> dict[int, dict[str, np.ndarray]]:
    """client → {split: …} of clients.parquet's `column` for each of SPLITS, rows in ascending sample."""
    table, width = partition.clients, len(SPLITS)
    code = np.select([table["split"] == name for name in SPLITS], list(range(width)), -1)
    if (code < 0).any():  # would be filed under the previous client's last split
        raise ValueError(f"clients.parquet: split {table['split'][code < 0].iloc[0]!r} is none of {', '.join(SPLITS)}")
    key = table["client"].to_numpy(np.int64) * width + code
    order = np.lexsort((table["sample"].to_numpy(np.int64), key))
    key, values = key[order], table[column].to_numpy()[order]
    bounds = np.searchsorted(key, np.arange(width * partition.num_clients + 1))
    return {k: {name: values[bounds[width * k + s]:bounds[width * k + s + 1]] for s, name in enumerate(SPLITS)}
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
    """client → {'train': (x, y), 'test': (x, y), 'val': (x, y)} with the client's transform (a mixture client's:
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
