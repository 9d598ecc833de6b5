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
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from cflpipe.fl.method import Update, stack_updates
from cflpipe.fl.plan import ClientPlan
from cflpipe.metrics import tensor_bytes
from cflpipe.methods.clustered import ClusterModels

# Purposes of the server randomness: the pivots of the start's and of each merge's clustering.
_PIVOTS_INIT, _PIVOTS_MERGE = 0x5A, 0x5B


def trimmed_mean(vectors: torch.Tensor, beta: float) -> torch.Tensor:
    """The coordinate-wise β-trimmed mean of the rows: each coordinate's int(β·n) smallest and
    largest values left out (scipy.stats.trim_mean's cut); the plain mean when β is 0 or fewer
    than 2 values would remain (the authors' rule)."""
    n = vectors.shape[0]
    cut = int(beta * n)
    if cut == 0 or n - 2 * cut < 2:
        return vectors.mean(0)
    return vectors.sort(dim=0).values[cut:n - cut].mean(0)


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
    """λ from the data: the ceil(fraction · pairs)-th smallest distance between two clients."""
    pairs = distances[np.triu_indices(len(distances), k=1)]
    if not len(pairs):
        return math.inf
    return float(np.sort(pairs)[max(math.ceil(fraction * len(pairs)), 1) - 1])


class SRFCA(ClusterModels):
    """SR-FCA (reconstructed from the authors' code): one-shot clustering of local models by cross-entropy
    distance, then refinement with trimmed-mean cluster training, re-clustering and merging.

    Round 0, before training (INIT): every client trains its own model from the initial one for
    `init_steps` local steps (off-round traffic: one model down, one up); each client then
    receives every local model and reports its mean training cross-entropy under each (N losses
    up), so L[i, j] = loss of client i's model on client j's data and the distance is
    d(i, j) = (L[i, j] + L[j, i]) / 2. λ is `threshold`, or the `dist_fraction` quantile of the
    pairwise distances. Clients within λ are linked and grouped by pivot correlation clustering
    (seeded); groups of at most `size_threshold` clients are dropped.

    The rounds are cut into `refine_steps` equal blocks. In each block every cluster trains a
    model from the initial one (a fresh start, as the authors' REFINE), its sampled members'
    models combined by the coordinate-wise `beta`-trimmed mean (unweighted). Between blocks:
    RECLUSTER (every client to the cluster k minimising ½(mean over k's members j of L[i, j] +
    the loss of k's model on client i's data); clusters with fewer than `size_threshold` members
    dropped) and MERGE (clusters whose models are within λ, ½(loss of k's model on l's members'
    data + l's on k's), linked and grouped by correlation clustering). Each step's evaluations
    travel as the start's: the cluster models down, one loss per model up.

    Departures from the authors' code, each because cflpipe's run differs:
    - The clients of a round are the run's sample (training.clients_per_round over all
      clients), not ten per cluster; the local models start from the run's initial model.
    - A client left without a cluster (its group dropped at INIT or at RECLUSTER) joins the
      nearest kept cluster (the code leaves it unassigned); when no group is kept, all clients
      form one cluster (the code fails).
    - Distances use the clients' training data as the code does, through the run's evaluation
      of models (float32 logits, cross-entropy averaged per client)."""

    checkpoint = (*ClusterModels.checkpoint, "local_losses", "lam")

    @classmethod
    def check_hyperparams(cls, params):
        return {"init_steps": 2, "size_threshold": 1}

    def __init__(self, ctx):
        super().__init__(ctx, 1, np.zeros(ctx.num_clients, dtype=np.int64))
        n = ctx.num_clients
        self.local_losses = torch.full((n, n), float("nan"), dtype=torch.float64)
        self.lam = float("nan")
        self._metrics: dict[str, float] = {}

    # ------------------------------------------------------------------ schedule

    def _block_starts(self) -> set[int]:
        rounds, steps = self.ctx.training.rounds, min(self.hp.refine_steps, self.ctx.training.rounds)
        return {round(b * rounds / steps) for b in range(1, steps)}

    def round_start(self, sampled: np.ndarray) -> None:
        self._metrics = {}
        if self.ctx.round == 0:
            self._init()
        elif self.ctx.round in self._block_starts():
            self._recluster_and_merge()

    # ------------------------------------------------------------------ losses

    def _losses_on_clients(self, models: torch.Tensor) -> torch.Tensor:
        """(models × clients) mean training cross-entropy of each model on each client's data;
        each client receives the models and sends one loss per model."""
        ctx = self.ctx
        out = torch.zeros(len(models), ctx.num_clients, dtype=torch.float64)
        for client in range(ctx.num_clients):
            x, y = ctx.view(client).data()
            ctx.count_traffic(tensor_bytes(models), 4 * len(models))
            if not len(y):
                continue
            logits = ctx.apply(models, x, chunk=ctx.training.eval_batch_size)
            for m in range(len(models)):
                out[m, client] = float(F.cross_entropy(logits[m].float(), y))
        return out

    def _init(self) -> None:
        ctx = self.ctx
        plans = {c: ClientPlan(ctx.init.clone(), steps=self.hp.init_steps) for c in range(ctx.num_clients)}
        trained = ctx.train_unsampled(plans)
        clients = np.array(sorted(trained), dtype=np.int64)
        models = torch.stack([trained[int(c)].vector for c in clients])
        losses = self._losses_on_clients(models)  # (trained clients × all clients)
        self.local_losses[torch.from_numpy(clients)] = losses
        d = self._pair_distances(clients)
        self.lam = self.hp.threshold if self.hp.threshold is not None else pair_threshold(d, self.hp.dist_fraction)
        edges = d <= self.lam
        labels = correlation_clusters(edges, ctx.rng(_PIVOTS_INIT))
        sizes = np.bincount(labels)
        kept = np.flatnonzero(sizes > self.hp.size_threshold)
        assignment = np.full(ctx.num_clients, -1, dtype=np.int64)
        if len(kept):
            renumber = {int(k): i for i, k in enumerate(kept)}
            for row, client in enumerate(clients):
                if int(labels[row]) in renumber:
                    assignment[client] = renumber[int(labels[row])]
            # the rest (dropped groups; clients whose local model diverged): the nearest kept group
            full = self._pair_distances(np.arange(ctx.num_clients))
            for client in np.flatnonzero(assignment < 0):
                means = [np.nanmean(full[client, assignment == k]) for k in range(len(kept))]
                assignment[client] = int(np.nanargmin(means)) if not np.all(np.isnan(means)) else 0
        else:
            assignment[:] = 0
        self.clusters = assignment
        self.centers = ctx.init.repeat(int(assignment.max()) + 1, 1)
        self._metrics.update(srfca_lambda=self.lam, srfca_init_groups=float(len(sizes)),
                             srfca_dropped=float(len(sizes) - len(kept)))

    def _pair_distances(self, clients: np.ndarray) -> np.ndarray:
        """d(i, j) = (L[i, j] + L[j, i]) / 2 among `clients` (NaN where a model is missing)."""
        index = torch.from_numpy(clients)
        losses = self.local_losses[index][:, index]
        return ((losses + losses.T) / 2).numpy()

    def _recluster_and_merge(self) -> None:
        ctx = self.ctx
        k = self.num_clusters
        on_clients = self._losses_on_clients(self.centers).numpy()  # (clusters × clients)
        local = self.local_losses.numpy()  # L[i, j]: client i's model on client j's data
        # RECLUSTER: ½(mean over k's members j of L[i, j] + loss of k's model on client i's data)
        distance = np.full((ctx.num_clients, k), np.inf)
        for cluster in range(k):
            members = self.clusters == cluster
            if members.any():
                distance[:, cluster] = (np.nanmean(local[:, members], axis=1) + on_clients[cluster]) / 2
        distance = np.where(np.isnan(distance), np.inf, distance)
        assignment = distance.argmin(axis=1)
        sizes = np.bincount(assignment, minlength=k)
        kept = sizes >= self.hp.size_threshold
        if not kept.any():
            kept[int(sizes.argmax())] = True
        assignment = np.where(kept[assignment], assignment, np.where(kept, distance, np.inf).argmin(axis=1))
        survivors = np.flatnonzero(np.bincount(assignment, minlength=k) > 0)
        # MERGE: ½(loss of k's model on l's members' data + l's on k's members' data) within λ
        merged_distance = np.zeros((len(survivors), len(survivors)))
        for a, ka in enumerate(survivors):
            for b, kb in enumerate(survivors):
                merged_distance[a, b] = (on_clients[ka, assignment == kb].mean() +
                                         on_clients[kb, assignment == ka].mean()) / 2
        groups = correlation_clusters(merged_distance <= self.lam, ctx.rng(_PIVOTS_MERGE))
        to_group = {int(cluster): int(groups[a]) for a, cluster in enumerate(survivors)}
        self.clusters = np.array([to_group[int(c)] for c in assignment], dtype=np.int64)
        # the next REFINE trains every cluster from the start again (the authors' fresh models)
        self.centers = ctx.init.repeat(int(groups.max()) + 1, 1)
        self._metrics.update(srfca_dropped=float(k - int(kept.sum())), srfca_merged=float(len(survivors) - groups.max() - 1))

    # ------------------------------------------------------------------ aggregation

    def cluster_aggregate(self, updates: dict[int, Update]) -> None:
        """Each cluster's model: the β-trimmed mean of its sampled members' models."""
        if not updates:
            return
        clients, vectors, _ = stack_updates(updates)
        labels = self.clusters[clients]
        for cluster in np.unique(labels):
            rows = torch.from_numpy(np.flatnonzero(labels == cluster)).to(vectors.device)
            self.centers[int(cluster)] = trimmed_mean(vectors[rows], self.hp.beta)

    def round_metrics(self) -> dict[str, Any]:
        return {**super().round_metrics(), **self._metrics}
