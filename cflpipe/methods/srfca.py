"""SR-FCA, successive refinement federated clustering (Harshvardhan, Ghosh and Mazumdar, "An
Improved Federated Clustering Algorithm with Model-based Clustering", TMLR 2024),
reconstructed from the authors' code (github.com/harshv834/sr-fca at a1b418f, `sr_fca.py`): the
paper cannot be read here; docs/research/flux-srfca.md §2 has the file:line notes.

One-shot start: every client trains a model of its own; clients whose models do well on each
other's data (a symmetric cross-entropy distance at most λ) are grouped by correlation
clustering of that threshold graph, small groups dropped. Then refinement steps: each cluster
trains a model with a coordinate-wise trimmed mean of its members' models (robust to members
that do not belong), every client moves to the cluster whose model is nearest to its own, small
clusters are dropped and clusters whose models are within λ of each other merge.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import torch

from cflpipe.fl.method import ClientView, Context, Payload, Placement, Update, stack_updates, take_rows
from cflpipe.fl.plan import ClientPlan
from cflpipe.methods.clustered import ClusterModels, asked_losses

# Purposes of the server randomness: the pivots of the start's and of each merge's clustering.
_PIVOTS_INIT, _PIVOTS_MERGE = 0x5A, 0x5B
# Past this many bytes of the clients' own models, the start trains and scores them a block of
# clients at a time: what it holds is one block's models and the trainer's group for them, not
# every client's (10,000 clients of the mlp: 2.2 GB of models, held twice, stopped it past 8 GiB).
# The same models and losses; a population under it keeps the one block it always had.
START_BLOCK_BYTES = 256 << 20
# Rows of the clients' pair distances the start makes at a time (from L, when it groups them).
DISTANCE_ROWS = 256


def trimmed_mean(vectors: torch.Tensor, trim: float) -> torch.Tensor:
    """The authors' coordinate-wise trimmed mean: each coordinate's values sorted, the rows
    [int(trim·n), int((1 − trim)·n)) averaged (so with int(trim·n) = 0 the largest value may still
    be left out: n = 6, trim = 0.15 keeps 5); the plain mean when trim is 0 or fewer than 2 values
    would remain."""
    n = vectors.shape[0]
    low, high = int(trim * n), int((1 - trim) * n)
    if trim == 0 or high - low < 2:
        return vectors.mean(0)
    return vectors.sort(dim=0).values[low:high].mean(0)


def correlation_clusters(edges: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Pivot correlation clustering of a graph (boolean adjacency): a random remaining node and
    its remaining neighbours form a cluster, until none remains. Clusters numbered in the order
    they form."""
    labels = np.full(len(edges), -1, dtype=np.int64)
    remaining = np.ones(len(edges), dtype=bool)
    cluster = 0
    while remaining.any():
        pivot = int(rng.choice(np.flatnonzero(remaining)))
        members = remaining & edges[pivot]
        members[pivot] = True
        labels[members] = cluster
        remaining &= ~members
        cluster += 1
    return labels


def pair_threshold(distances: np.ndarray, fraction: float) -> float:
    """λ from the data, as the authors index it: the sorted pairwise distances at 0-based
    position ceil(fraction · pairs) (the (ceil(f·P) + 1)-th smallest; clamped to the largest,
    where their code fails at fraction 1). Pairs without a distance (NaN) are left out."""
    return threshold_at(upper_pairs(distances, 0), fraction)


def upper_pairs(rows: np.ndarray, first: int) -> np.ndarray:
    """The known distances (not NaN) right of the diagonal in rows first, first + 1, … of the
    pair distances, row by row."""
    pairs = rows[np.triu(np.ones(rows.shape, dtype=bool), k=first + 1)]
    return pairs[~np.isnan(pairs)]


def threshold_at(pairs: np.ndarray, fraction: float) -> float:
    """pair_threshold's λ from the known pairs (reordered in place: a partial sort gives the same
    order statistic as a sort, without its copy)."""
    if not len(pairs):
        return math.inf
    position = min(math.ceil(fraction * len(pairs)), len(pairs) - 1)
    pairs.partition(position)
    return float(pairs[position])


def nearest(distance: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """Each row's column of smallest distance among the allowed columns (NaN: unknown, never
    chosen while a known one exists); the first allowed column for a row with none known."""
    masked = np.where(allowed[None, :] & ~np.isnan(distance), distance, np.inf)
    best = masked.argmin(axis=1)
    unknown = ~np.isfinite(masked.min(axis=1))
    best[unknown] = int(np.flatnonzero(allowed)[0])
    return best


class SRFCA(ClusterModels):
    """SR-FCA (reconstructed from the authors' code): clients' own models grouped once by a cross-entropy
    threshold graph, then clusters trained with a trimmed mean, re-clustered and merged (K found).

    Round 0, before training (INIT): every client trains its own model from the initial one for
    `init_steps` local steps (off-round traffic: one model down, one up); each client then
    receives every local model and reports its mean training cross-entropy under each (N losses
    up), so L[i, j] = loss of client i's model on client j's data and the distance is
    d(i, j) = (L[i, j] + L[j, i]) / 2. λ is `threshold`, or the distance at position
    ceil(`dist_fraction` · pairs) of the sorted pairwise distances. Clients within λ are linked
    and grouped by pivot correlation clustering (seeded); groups of at most `size_threshold`
    clients are dropped.

    The rounds are cut into `refine_steps` equal blocks. In each block every cluster trains a
    model from the run's initial one, its sampled members' models combined by the authors'
    coordinate-wise `trim`-trimmed mean (`trimmed_mean`, unweighted). Between blocks: RECLUSTER
    (every client to the cluster k minimising ½(mean over k's members j of L[i, j] + the loss of
    k's model on client i's data); clusters with fewer than `size_threshold` members dropped,
    their clients to the nearest surviving one) and MERGE (clusters whose models are within λ,
    ½(loss of k's model on l's members' data + l's on k's), linked and grouped by correlation
    clustering). Each step's evaluations travel as the start's: the cluster models down, one loss
    per model up.

    Departures from the authors' code, each because cflpipe's run differs:
    - The clients of a round are the run's sample (training.clients_per_round over all
      clients), not ten per cluster; a cluster none of whose members is sampled in a block keeps
      the initial model for that block.
    - Every model (the clients' own, each block's cluster models) starts from the run's
      initial model, not from a new random one.
    - A client left without a cluster (its group dropped at INIT, its own model diverged) joins
      the nearest kept group (the code leaves it out until the first RECLUSTER) and counts as a
      member there; when no group is kept, all clients form one cluster (the code fails).
    - Past START_BLOCK_BYTES of models the start trains and scores a block of clients at a time,
      and it groups (and later re-clusters) them from blocks of rows: the same L, λ and groups in
      bounded memory (10,000 clients stopped it past 8 GiB); bit for bit on the CPU, and on CUDA,
      where a block of models is applied in one vmap, to float rounding across blocks. The N²
      evaluations remain the method's: docs/performance.md.
    - A loss is the mean cross-entropy over a client's training samples (the code divides its
      summed batch means by the sample count, a scale about a batch size smaller: its λ values
      do not carry over); a client without training data has no loss (NaN), not 0."""

    checkpoint = (*ClusterModels.checkpoint, "local_losses", "lam")

    @classmethod
    def check_hyperparams(cls, params):
        return {"init_steps": 2, "size_threshold": 1}

    def __init__(self, ctx):
        super().__init__(ctx, 1, np.zeros(ctx.num_clients, dtype=np.int64))
        n = ctx.num_clients
        self.local_losses = np.full((n, n), np.nan)  # L[i, j]; NaN where client i has no model
        self.lam = float("nan")
        self._metrics: dict[str, float] = {}

    # ------------------------------------------------------------------ schedule

    def block_starts(self) -> set[int]:
        """The 0-based rounds that start a refinement block after the first."""
        rounds = self.ctx.training.rounds
        steps = min(self.hp.refine_steps, rounds)
        return {round(b * rounds / steps) for b in range(1, steps)}

    def round_start(self, sampled: np.ndarray) -> None:
        self._metrics = {}
        if self.ctx.round == 0:
            self._init()
        elif self.ctx.round in self.block_starts():
            self.recluster_and_merge(self.losses_on_clients(self.centers))

    # ------------------------------------------------------------------ losses

    def losses_on_clients(self, models: torch.Tensor) -> np.ndarray:
        """(models × clients) mean training cross-entropy of each model on each client's data
        (NaN for a client without training data); each client receives the models and sends one
        loss per model."""
        return asked_losses(self.ctx, models).T

    newcomer_rule = ("receives the cluster models, sends its training cross-entropy under each (the losses SR-FCA "
                     "clusters by) and is served the one of lowest loss")

    def place(self, newcomers: Context) -> Placement:
        return self.place_by_loss(newcomers, self.centers)

    @classmethod
    def query_plan(cls, view: ClientView, payload: Payload) -> tuple[ClientPlan | None, None]:
        """INIT's local models: `init_steps` from the initial model it is sent (query sends the
        trained model back); asked for losses, a client trains nothing."""
        if payload.meta.get("question") != "init":
            return super().query_plan(view, payload)
        return ClientPlan(payload.tensors["model"].clone(), steps=view.hp.init_steps), None

    def pair_distances(self, rows: slice | np.ndarray) -> np.ndarray:
        """Rows of d(i, j) = (L[i, j] + L[j, i]) / 2 (NaN where a model or a loss is missing): the
        start reads them a block at a time, never all N × N at once (0.8 GB at 10,000 clients)."""
        d = np.add(self.local_losses[rows], self.local_losses[:, rows].T)
        d /= 2
        return d

    def distance_blocks(self):
        """(first row, rows of d) a block of DISTANCE_ROWS at a time."""
        n = self.ctx.num_clients
        for first in range(0, n, DISTANCE_ROWS):
            yield first, self.pair_distances(slice(first, min(first + DISTANCE_ROWS, n)))

    def _init(self) -> None:
        ctx = self.ctx
        payload = Payload({"model": ctx.init}, {"question": "init"})
        block = max(1, START_BLOCK_BYTES // (ctx.init.numel() * ctx.init.element_size()))
        for first in range(0, ctx.num_clients, block):
            answers = ctx.ask({c: payload for c in range(first, min(first + block, ctx.num_clients))})
            if answers:
                clients, models = take_rows({c: answers.pop(c).tensors["model"] for c in list(answers)})
                self.local_losses[clients] = self.losses_on_clients(models)
                ctx.data.release_pages()  # every client's data read again: the store on disk lets it go
        self.clusters = self.group_clients()
        self.centers = ctx.init.repeat(int(self.clusters.max()) + 1, 1)

    def group_clients(self) -> np.ndarray:
        """INIT's clustering from the local losses: λ, the threshold graph, correlation
        clustering, groups of at most size_threshold dropped, the rest to the nearest kept group."""
        n = self.ctx.num_clients
        if self.hp.threshold is not None:
            self.lam = self.hp.threshold
        else:
            pairs, known = np.empty(n * (n - 1) // 2), 0
            for first, rows in self.distance_blocks():
                found = upper_pairs(rows, first)
                pairs[known:known + len(found)] = found
                known += len(found)
            self.lam = threshold_at(pairs[:known], self.hp.dist_fraction)
            del pairs
        edges = np.empty((n, n), dtype=bool)
        with np.errstate(invalid="ignore"):
            for first, rows in self.distance_blocks():
                edges[first:first + len(rows)] = rows <= self.lam
        labels = correlation_clusters(edges, self.ctx.rng(_PIVOTS_INIT))
        del edges
        sizes = np.bincount(labels)
        kept = np.flatnonzero(sizes > self.hp.size_threshold)
        self._metrics.update(srfca_lambda=self.lam, srfca_init_groups=float(len(sizes)),
                             srfca_dropped=float(len(sizes) - len(kept)))
        if not len(kept):
            return np.zeros(self.ctx.num_clients, dtype=np.int64)
        assignment = np.searchsorted(kept, labels)
        inside = np.isin(labels, kept)
        # the rest: the kept group of the smallest mean distance to its members (their rows alone:
        # each row's mean is the same sum over the same row)
        outside = np.flatnonzero(~inside)
        labels = np.where(inside, assignment, 0).astype(np.int64)
        for block in np.array_split(outside, -(-len(outside) // DISTANCE_ROWS)) if len(outside) else ():
            rows = self.pair_distances(block)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # a client without any distance
                to_groups = np.stack([np.nanmean(np.where(inside & (assignment == g), rows, np.nan), axis=1)
                                      for g in range(len(kept))], axis=1)
            labels[block] = nearest(to_groups, np.ones(len(kept), dtype=bool))
        return labels

    def recluster_and_merge(self, on_clients: np.ndarray) -> None:
        """RECLUSTER and MERGE from `on_clients`, the (clusters × clients) losses of the cluster
        models (losses_on_clients of the centers)."""
        k = self.num_clusters
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # clients or clusters without a loss
            # ½(mean over k's members j of L[i, j] + loss of k's model on client i's data); a client
            # without a model of its own: the second term alone
            own = np.empty((len(self.clusters), k))
            for first in range(0, len(own), DISTANCE_ROWS):  # each row's mean as over all rows at once
                block = self.local_losses[first:first + DISTANCE_ROWS]
                own[first:first + len(block)] = np.stack([np.nanmean(block[:, self.clusters == c], axis=1)
                                                          for c in range(k)], axis=1)
            distance = np.where(np.isnan(own), on_clients.T, (own + on_clients.T) / 2)
            first = nearest(distance, np.ones(k, dtype=bool))
            sizes = np.bincount(first, minlength=k)
            kept = sizes >= self.hp.size_threshold
            if not kept.any():
                kept[int(sizes.argmax())] = True
            assignment = np.where(kept[first], first, nearest(distance, kept))
            survivors = np.flatnonzero(np.bincount(assignment, minlength=k) > 0)
            # MERGE: ½(loss of a's model on b's members' data + b's on a's) within λ
            between = np.array([[(np.nanmean(on_clients[a, assignment == b]) + np.nanmean(on_clients[b, assignment == a])) / 2
                                 for b in survivors] for a in survivors])
        with np.errstate(invalid="ignore"):
            groups = correlation_clusters(between <= self.lam, self.ctx.rng(_PIVOTS_MERGE))
        to_group = dict(zip(survivors.tolist(), groups.tolist()))
        self.clusters = np.array([to_group[int(c)] for c in assignment], dtype=np.int64)
        # the next REFINE trains every cluster from the start again (the authors' fresh models)
        self.centers = self.ctx.init.repeat(int(groups.max()) + 1, 1)
        self._metrics.update(srfca_dropped=float(k - len(survivors)), srfca_merged=float(len(survivors) - groups.max() - 1))

    # ------------------------------------------------------------------ aggregation

    def cluster_aggregate(self, updates: dict[int, Update]) -> None:
        """Each cluster's model: the trimmed mean of its sampled members' models."""
        if not updates:
            return
        clients, vectors, _ = stack_updates(updates)
        labels = self.clusters[clients]
        for cluster in np.unique(labels):
            rows = torch.from_numpy(np.flatnonzero(labels == cluster)).to(vectors.device)
            self.centers[int(cluster)] = trimmed_mean(vectors[rows], self.hp.trim)

    def round_metrics(self) -> dict[str, Any]:
        return {**super().round_metrics(), **self._metrics}
