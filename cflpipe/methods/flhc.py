"""FL+HC (Briggs, Fan and Andras 2020, "Federated learning with hierarchical clustering of local
updates to improve training on non-IID data", IJCNN 2020).

FedAvg for `cluster_round` rounds; then, in one round, every client computes an update from the
current global model and the server clusters those updates once, by agglomerative hierarchical
clustering (Euclidean distance, ward linkage by default) cut at a distance threshold or into a
fixed number of clusters; from then on FedAvg runs independently inside each cluster.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from cflpipe.clustering import hierarchical_clusters
from cflpipe.clustering.tools import lean_pairwise
from cflpipe.fl.method import ROUND, Context, Payload, Placement, Update, take_rows
from cflpipe.methods.clustered import ClusterModels
from cflpipe.fl.params import cluster_average

# ---------------------------------------------------------------------------- FL+HC


class FLHC(ClusterModels):
    """FL+HC: FedAvg, then one hierarchical clustering of all clients' updates, then FedAvg per cluster.

    Clustering round (0-based round index `cluster_round`): the sampled clients train as usual
    and every other client also trains once from the global model (counted as off-round traffic:
    one model down, one up). The server clusters the updates Δ_i = w_i − w_global of all clients
    and starts each cluster from the sample-weighted average of its members' new models, i.e. one
    FedAvg step inside each cluster with all of its members. Clients whose clustering update
    diverged (on_divergence: skip) join the largest cluster.

    The paper cuts the dendrogram at a distance threshold and sweeps it per data set; there is no
    scale-free value, since update magnitudes depend on model size, lr and local steps. The
    default 3.0 (Euclidean, ward) is a starting point only: check a run's n_clusters and set
    distance_threshold, or clusters when the number of groups is known.

    `threshold: relative` (not in the paper) makes distance_threshold a multiple of the mean norm
    of the clustered updates, measured in the clustering round and written to rounds.parquet
    (`flhc_mean_update_norm`). Update norms scale with lr, local steps and model size, and so do
    the distances between updates; their ratio does not. It reads geometrically: two single
    updates of norm r merge below a height of r·√2 when orthogonal and 2r when opposite (ward's
    height between single points is their Euclidean distance; between clusters it grows with
    their sizes)."""

    @classmethod
    def check_hyperparams(cls, params):
        return {"cluster_round": 1, "clusters": 2}

    checkpoint = (*ClusterModels.checkpoint, "clustered")

    def __init__(self, ctx):
        super().__init__(ctx, 1, np.zeros(ctx.num_clients, dtype=np.int64))
        self.clustered = False
        self._off_round: dict[int, torch.Tensor] = {}
        self._mean_update_norm: float | None = None

    def round_start(self, sampled: np.ndarray) -> None:
        self._off_round = {}
        self._mean_update_norm = None
        if self.clustered or self.ctx.round != self.hp.cluster_round:
            return
        # The clients not sampled train the global model as well (the paper clusters them all).
        chosen = set(int(c) for c in sampled)
        payload = Payload({"model": self.centers[0]}, {"question": ROUND})
        answers = self.ctx.ask({c: payload for c in range(self.ctx.num_clients) if c not in chosen})
        self._off_round = {c: answer.tensors["model"] for c, answer in answers.items()}

    newcomer_rule = ("trains the mean of the cluster models for one round's local steps and joins the cluster whose "
                     "model is nearest (L2) to what it trained, served that cluster's model")

    def place(self, newcomers: Context) -> Placement:
        return self.place_nearest(newcomers)

    def cluster_aggregate(self, updates: dict[int, Update]) -> None:
        if self.clustered or self.ctx.round != self.hp.cluster_round:
            super().cluster_aggregate(updates)
            return
        models = {c: u.tensors["model"] for c, u in updates.items()}
        models.update(self._off_round)
        self._off_round = {}
        if not models:
            return
        clients, vectors = take_rows(models)
        sizes = self.ctx.train_sizes()
        weights = torch.as_tensor(sizes[clients], dtype=vectors.dtype, device=vectors.device)
        if lean_pairwise(vectors, self.hp.metric):
            # At this size hierarchical_clusters works from the rows' mean, where the updates and the
            # models are the same points: no third (clients × parameters) matrix for the updates.
            self._mean_update_norm = float(torch.cat([(part - self.centers[0]).norm(dim=1)
                                                      for part in vectors.split(4096)]).mean())
            updates = vectors
        else:
            updates = vectors - self.centers[0]
            self._mean_update_norm = float(updates.norm(dim=1).mean())
        labels = hierarchical_clusters(updates, linkage=self.hp.linkage, metric=self.hp.metric,
                                       **self.hp.cut(self._mean_update_norm))
        del updates
        k = int(labels.max()) + 1
        means, _ = cluster_average(vectors, torch.from_numpy(labels), weights, k)
        assignment = np.full(self.ctx.num_clients, -1, dtype=np.int64)
        assignment[clients] = labels
        missing = np.nonzero(assignment < 0)[0]
        if len(missing):  # diverged in the clustering round: largest cluster
            assignment[missing] = int(np.bincount(labels).argmax())
        self.centers = means
        self.clusters = assignment
        self.clustered = True

    def round_metrics(self) -> dict[str, Any]:
        metrics = super().round_metrics()
        if self._mean_update_norm is not None:
            metrics["flhc_mean_update_norm"] = self._mean_update_norm
        return metrics
