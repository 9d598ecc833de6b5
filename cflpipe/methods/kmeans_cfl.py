"""Clustered FL by K-means on client models: the base of AWCFL/MCFL's Algorithms 1–2 (seed
paper 001). Each round the sampled clients train from their cluster's model and upload it; the
server runs K-means on the latest model of every client that has uploaded one, averages each
cluster's members
(Algorithm 1, steps 3.2–3.3 with β = 0) and sends every client its cluster's model. Before
`cluster_start` all clients form one cluster (the paper starts clustering after 20 rounds)."""

from __future__ import annotations

import numpy as np
import torch

from cflpipe.clustering import canonical_labels, kmeans, nearest_center
from cflpipe.clustering.carried import CarriedKMeans
from cflpipe.fl.method import Context, Placement, Update
from cflpipe.methods.clustered import ClusterModels
from cflpipe.fl.params import cluster_average


class KMeansCFL(ClusterModels):
    """K-means CFL: K-means on the clients' latest models every round, then per-cluster averaging (AWCFL/MCFL's base)."""

    @classmethod
    def check_hyperparams(cls, params):
        return {"cluster_start": 1, "clusters": 2, "n_init": 2}

    newcomer_rule = ("trains the mean of the cluster models for one round's local steps and joins the cluster whose "
                     "model is nearest (L2) to what it trained, served that cluster's model")

    def place(self, newcomers: Context) -> Placement:
        return self.place_nearest(newcomers)

    checkpoint = (*ClusterModels.checkpoint, "latest", "seen")
    # The paper's standalone Algorithms 1 (AWCFL) and 2 (MCFL) are K-means CFL with the option.

    def __init__(self, ctx):
        super().__init__(ctx, 1, np.zeros(ctx.num_clients, dtype=np.int64))
        self.latest = ctx.table("latest", ctx.init)  # the server's copy of every client's model
        # Clients that have uploaded at least once. The paper's clients all train every round; with
        # partial participation only uploaded models are clustered and averaged, so untouched
        # initial models do not drag the cluster models back.
        self.seen = np.zeros(ctx.num_clients, dtype=bool)
        # `kmeans_start: last` carries Lloyd's algorithm from round to round (clustering/carried.py):
        # it needs each moved row's value before the round, so uploads arrive as copies.
        self.carried: CarriedKMeans | None = None
        if self.hp.kmeans_start == "last":
            self.uploads_into = None
            self.checkpoint = (*self.checkpoint, "carried_state")

    # The trained model goes straight into the client's row of the server's table (not if its
    # training diverged): at full participation no round-long copy of every upload.
    uploads_into = "latest"

    @property
    def carried_state(self) -> dict[str, torch.Tensor] | None:
        return None if self.carried is None else self.carried.state()

    @carried_state.setter
    def carried_state(self, state: dict[str, torch.Tensor] | None) -> None:
        self.carried = None if state is None else CarriedKMeans.from_state(state, self.latest.device)

    def cluster_aggregate(self, updates: dict[int, Update]) -> None:
        if not updates:
            return
        clients = np.array(sorted(updates), dtype=np.int64)
        before = self.latest[torch.from_numpy(clients).to(self.latest.device)] if self.carried is not None else None
        for client in clients:  # row by row: no stacked copy of every model
            update = updates[int(client)]
            # Mostly the row itself already (the plan's `into`): then there is nothing to copy.
            if update.tensors["model"].data_ptr() != self.latest[client].data_ptr():
                self.latest[client] = update.tensors["model"]
        self.seen[clients] = True
        known = np.nonzero(self.seen)[0]
        k = min(self.hp.clusters, len(known))
        if self.ctx.round + 1 >= self.hp.cluster_start and k > 1:
            if self.carried is not None and self.carried.k == k:
                # `kmeans_start: last`: Lloyd's algorithm continued from the last round's clusters
                # after this round's uploads, reading the uploads and the rows near a boundary only
                # (the partition of a Lloyd run over every row from the last clusters' means; the
                # paper writes K-means each round and states no initialization).
                labels, self.centers = self.carried_labels(known, self.carried.update(self.latest, clients, before)[known])
            else:
                labels = self.fresh_round(known, k)
        else:
            labels = self.fresh_round(known, 1)
        self.clusters[known] = labels
        unseen = np.nonzero(~self.seen)[0]
        if len(unseen):  # not trained yet: the cluster whose model is nearest to theirs
            # Their rows all still hold the initial model (a diverged training writes no row):
            # one row answers for all of them, where a copy of every unseen row was N × d (#59).
            self.clusters[unseen] = nearest_center(self.ctx.init[None], self.centers)[0]

    def fresh_round(self, known: np.ndarray, k: int) -> np.ndarray:
        """Step 3.2's K-means afresh (n_init random restarts) on the known clients' models, labels in
        order of first appearance (cluster ids do not permute between rounds), and step 3.3's
        averages; with `kmeans_start: last` the clustering is then carried to the next rounds."""
        # Once every client has uploaded, cluster the server's table itself rather than a copy.
        models = self.latest if len(known) == self.ctx.num_clients else self.latest[known]
        labels = np.zeros(len(known), dtype=np.int64)
        if k > 1:
            labels = canonical_labels(kmeans(models, k, seed=self.ctx.rng(0xC1), n_init=self.hp.n_init).labels)
        if k > 1 and self.hp.kmeans_start == "last" and len(np.unique(labels)) == k:
            # carried from here on, from its own labels (its Lloyd steps may move a row the
            # engine's stopped short of moving)
            self.carried = CarriedKMeans.start(self.latest, known, labels, k)
            labels, self.centers = self.carried_labels(known, self.carried.labels.cpu().numpy()[known])
            return labels
        ones = torch.ones(len(known), dtype=self.latest.dtype, device=self.latest.device)
        self.centers, _ = cluster_average(models, torch.from_numpy(labels), ones, int(labels.max()) + 1)
        return labels

    def carried_labels(self, known: np.ndarray, own: np.ndarray) -> tuple[np.ndarray, torch.Tensor]:
        """The carried clustering's labels of the known clients (its own numbers) in order of first
        appearance, and the present clusters' means in that order."""
        labels = canonical_labels(own)
        order = np.zeros(self.carried.k, dtype=np.int64)
        order[own] = labels  # each present cluster's canonical number (an empty one keeps none)
        present = np.unique(own)
        centers = torch.empty(len(present), self.latest.shape[1], dtype=self.latest.dtype, device=self.latest.device)
        centers[torch.from_numpy(order[present])] = self.carried.means()[torch.from_numpy(present)].to(centers)
        return labels, centers
