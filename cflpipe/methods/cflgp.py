"""CFL-GP (Kim, Kim and de Veciana 2024, "Clustered federated learning via gradient-based
partitioning", ICML 2024; authors' code github.com/Heasung-Kim/clustered-federated-learning-via-
gradient-based-partitioning, `run_CFLGP`, model-averaging protocol).

K cluster models; every client's model updates are accumulated into its column of a gradient
profile matrix; every `period` rounds, until round `stop_after`, the server projects the profiles
on their K leading singular directions, clusters the projections by k-means into K clusters and
matches the new labels to the old ones (so that a cluster keeps its model); each cluster's model
is the average of its members' trained models.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from cflpipe.clustering import kmeans
from cflpipe.fl.method import Context, Payload, Placement, Update
from cflpipe.methods.clustered import ADAPT, ClusterModels
from cflpipe.seeds import rng

# Purpose of the server randomness that seeds the k-means.
_KMEANS = 0xC6
# Purpose of the run's randomness that picks the coordinates a profile keeps (profile_share).
_COORDINATES = 0xC7


def profile_weight(round_index: int, clusters: int, period: int) -> float:
    """β of the cumulative average of a client's profile, 1/(⌊(r + 1)/(K·period)⌋ + 1) in round r
    (the authors' code): 1 up to round K·period − 2, then 1/2, 1/3, … per further K·period rounds."""
    return 1.0 / (np.floor((round_index + 1) / (clusters * period)) + 1.0)


def match_labels(new: np.ndarray, old: np.ndarray, k: int) -> np.ndarray:
    """`new` relabelled by the permutation of 0…k−1 that agrees with `old` on the most clients
    (the authors try every permutation; the assignment problem gives the same maximum)."""
    from scipy.optimize import linear_sum_assignment

    agreement = np.zeros((k, k), dtype=np.int64)
    np.add.at(agreement, (new, old), 1)
    rows, columns = linear_sum_assignment(-agreement)
    mapping = np.empty(k, dtype=np.int64)
    mapping[rows] = columns
    return mapping[new]


class CFLGP(ClusterModels):
    """CFL-GP: clients partitioned by spectral clustering of their accumulated model updates.

    Every client starts in cluster 0 (all train the initial model). In a round r with
    r mod `period` = 0 and r < `stop_after`, each sampled client's update Δ = (trained model −
    its cluster's model) enters its profile by a cumulative average, g_i ← (1 − β)·g_i + β·Δ
    (`profile_weight`; a client's first profile is its Δ); then the profiles of the clients heard from so far are reduced to their
    coordinates on the K leading singular directions (an SVD of the profile matrix), clustered by
    k-means (k-means++, 10 starts) into K clusters, and the labels matched to the previous ones
    (`match_labels`). The round's trained models are then averaged per (new) cluster, sample-
    weighted; after `stop_after` the clusters stay and each cluster runs FedAvg.

    Where we differ from the authors' code, and why: their every client takes part in every
    round; here the engine samples, so a profile is refreshed only when its client is sampled in
    a profile round, and only clients with a profile are clustered (the others keep cluster 0
    until they have one). Their models average with equal weights; here by samples, as every
    cluster method of cflpipe. Their k-means uses sklearn's fixed random_state 42; ours is seeded
    from the run. Their code keeps a K-block profile but fills only the first block (the
    criterion model stays 0); a client's profile here is its one block. `profile_share` below 1
    keeps a seeded random share of the coordinates, as their `use_reduced_G` does (1 %): what lets
    the profiles of 10,000 clients fit (docs/performance.md, "Every clustered method at scale")."""

    checkpoint = (*ClusterModels.checkpoint, "profile", "profiled")

    @classmethod
    def check_hyperparams(cls, params):
        return {"clusters": 2, "period": 1}

    def __init__(self, ctx: Context):
        super().__init__(ctx, ctx.hp.clusters, np.zeros(ctx.num_clients, dtype=np.int64))
        # The coordinates a profile keeps (None: all), drawn from the run's seed alone so that a
        # resumed run keeps them.
        self.coordinates = None
        width = ctx.init.numel()
        if self.hp.profile_share < 1:
            count = max(1, int(width * self.hp.profile_share))
            chosen = np.sort(rng(ctx.seed, _COORDINATES).choice(width, count, replace=False))
            self.coordinates = torch.from_numpy(chosen).to(ctx.device)
            width = count
        self.profile = torch.zeros(ctx.num_clients, width, dtype=ctx.init.dtype, device=ctx.device)
        self.profiled = np.zeros(ctx.num_clients, dtype=bool)
        self._singular: list[float] = []

    def _profile_round(self) -> bool:
        r = self.ctx.round
        return r % self.hp.period == 0 and r < self.hp.stop_after

    def cluster_aggregate(self, updates: dict[int, Update]) -> None:
        self._singular = []
        if updates and self._profile_round():
            beta = profile_weight(self.ctx.round, self.hp.clusters, self.hp.period)
            for client, update in updates.items():
                delta = self._kept(update.tensors["model"] - self.centers[self.clusters[client]])
                # A client's first profile is its update itself, whatever the round: averaged
                # with the zero it starts from it would be shrunk by β, and the clustering would
                # separate clients by when they were first sampled.
                weight = beta if self.profiled[client] else 1.0
                self.profile[client] = (1 - weight) * self.profile[client] + weight * delta
                self.profiled[client] = True
            self._recluster()
        super().cluster_aggregate(updates)

    def _kept(self, delta: torch.Tensor) -> torch.Tensor:
        """The coordinates of an update (or of rows of updates) a profile keeps."""
        return delta if self.coordinates is None else delta[..., self.coordinates]

    def _recluster(self) -> None:
        known = np.nonzero(self.profiled)[0]
        k = self.hp.clusters
        if len(known) < k:
            return
        profiles = self.profile[known].to(torch.float64)
        u, s, _ = torch.linalg.svd(profiles, full_matrices=False)
        reduced = u[:, :k] * s[:k]  # each client's coordinates on the K leading directions
        self._singular = s[:k].cpu().tolist()
        labels = kmeans(reduced, k, seed=self.ctx.rng(_KMEANS), init="k-means++").labels
        self.clusters[known] = match_labels(np.asarray(labels, dtype=np.int64), self.clusters[known], k)

    newcomer_rule = ("trains cluster 0's model for one round's local steps (where every client starts); its update, "
                     "as a profile, is projected on the K leading singular directions of the participants' profiles "
                     "and joins the cluster whose members' projections are nearest on average; served its model")

    def place(self, newcomers: Context) -> Placement:
        n = newcomers.num_clients
        known = np.nonzero(self.profiled)[0]
        clusters = np.zeros(n, dtype=np.int64)
        k = self.hp.clusters
        answers = newcomers.ask({c: Payload({"model": self.centers[0]}, {"question": ADAPT}) for c in range(n)})
        done = sorted(answers)
        if len(known) >= k and done:
            profiles = self.profile[known].to(torch.float64)
            u, s, vh = torch.linalg.svd(profiles, full_matrices=False)
            reduced = (u[:, :k] * s[:k]).cpu().numpy()
            labels = self.clusters[known]
            present = [j for j in range(k) if (labels == j).any()]
            centroids = np.stack([reduced[labels == j].mean(0) for j in present])
            deltas = self._kept(torch.stack([answers[c].tensors["model"] for c in done]) - self.centers[0])
            theirs = (deltas.to(torch.float64) @ vh[:k].T).cpu().numpy()
            nearest = ((theirs[:, None, :] - centroids[None]) ** 2).sum(-1).argmin(1)
            clusters[done] = np.asarray(present)[nearest]
        return self.served(newcomers, clusters, list(self.centers), clusters)

    def round_metrics(self) -> dict[str, Any]:
        metrics = super().round_metrics()
        if self._singular:
            metrics["cflgp_singular_values"] = list(self._singular)
        return metrics
