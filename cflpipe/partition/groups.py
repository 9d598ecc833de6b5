"""Group transforms (rotation, label_swap, flip) planned as the cells of their product, the
clients' cells, and a `mixture` step's per-sample cells."""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from cflpipe.data.base import Dataset
from cflpipe.errors import PartitionError
from cflpipe.spec import Scenario

# Up to 7 classes (5,040 permutations) the label_swap permutations are drawn from the full list.
_ENUMERATE_PERMUTATIONS_UP_TO = 7


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
    digits: np.ndarray                # (cells × transforms) each cell's group of each transform
    truth_steps: tuple[int, ...]      # the transforms (their positions) that define the truth


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
    return GroupPlan(len(digits), transforms, permutations, np.asarray(truth, dtype=np.int64), groups, digits,
                     tuple(truth_steps))


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


def _plan_drift(scenario: Scenario, plan: GroupPlan, cell_of_client: np.ndarray,
                rng: np.random.Generator) -> pd.DataFrame:
    """The scenario's drift events as moves (round, client, group, transform): each event draws
    its share of the clients, and each moves to a cell of another ground-truth group that keeps
    its groups of the transforms outside the truth (a feature shift stays), drawn uniformly.
    Events compound: a client moved twice leaves the group it was moved to."""
    cell = cell_of_client.copy()
    others = [k for k in range(plan.digits.shape[1]) if k not in plan.truth_steps]
    rows = []
    for event in scenario.drift:
        movers = np.sort(rng.choice(scenario.clients, size=scenario.drift_count(event), replace=False))
        for client in movers:
            here = cell[client]
            same_rest = (plan.digits[:, others] == plan.digits[here, others]).all(axis=1)
            options = np.flatnonzero(same_rest & (plan.truth != plan.truth[here]))
            cell[client] = options[rng.integers(len(options))]
            rows.append((event.round, int(client), int(plan.truth[cell[client]]), plan.transforms[cell[client]]))
    rounds, clients, groups, transforms = zip(*rows)
    return pd.DataFrame({"round": np.array(rounds, dtype=np.int32), "client": np.array(clients, dtype=np.int32),
                         "group": np.array(groups, dtype=np.int32), "transform": np.array(transforms, dtype=object)})


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
