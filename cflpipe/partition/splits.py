"""Label splits of a pool among clients: iid, Dirichlet (label-wise, or client-wise under
`quantity` sizes), pathological (labels per client, shards) and natural (one client per source),
and `quantity` sizes."""
from __future__ import annotations

import numpy as np

from cflpipe.errors import PartitionError


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
