"""PACFL (Vahidian, Morafah, Wang, Kungurtsev, Chen, Shah and Lin 2023, "Efficient distribution
similarity identification in clustered federated learning via principal angles between client
data subspaces", AAAI 2023; authors' code github.com/MMorafah/PACFL).

One-shot clustering before federation: every client sends a small basis of its data's subspace
(for each of its labels, the first p left singular vectors of the (features × samples) matrix of
that label's inputs, side by side); the server measures the angle between every two clients'
subspaces, clusters the clients once by agglomerative clustering of that proximity matrix cut at
a threshold (the number of clusters follows from the data), and FedAvg runs inside each cluster
from then on.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from cflpipe.clustering import cut_dendrogram
from cflpipe.fl.diagnosis import SINGLETONS
from cflpipe.fl.method import ClientView, Context, Payload, Placement, Update
from cflpipe.methods.clustered import ClusterModels

# The authors' linkage names and scipy's: their "average" replaces the two merged rows by their
# plain mean whatever the clusters' sizes, which is WPGMA (scipy's "weighted"), not UPGMA.
_SCIPY_LINKAGE = {"average": "weighted", "maximum": "complete", "minimum": "single"}


def client_subspace(view: ClientView, basis: int) -> torch.Tensor:
    """The client's upload: for each label it holds (in label order), the first `basis` left
    singular vectors of its (features × samples) input matrix of that label, side by side
    (features × basis·labels; fewer columns for a label with fewer samples)."""
    x, y = view.data()
    x = x.reshape(len(x), -1).to(torch.float64)
    columns = []
    for label in torch.unique(y).tolist():
        u, _, _ = torch.linalg.svd(x[y == label].T, full_matrices=False)
        columns.append(u[:, :basis])
    if not columns:  # a client without training data: an empty basis, at 90° from everything
        return x.new_zeros(x.shape[1], 0)
    return torch.cat(columns, dim=1)


def proximity_matrix(bases: list[torch.Tensor]) -> torch.Tensor:
    """A[i, j] = the smallest angle (degrees) between a basis vector of client i and one of
    client j: arccos of the largest |u·w| (the authors' measure, with |·|: see PACFL)."""
    m = len(bases)
    widths = torch.tensor([b.shape[1] for b in bases])
    stacked = torch.cat(bases, dim=1)
    owner = torch.repeat_interleave(torch.arange(m), widths).to(stacked.device)
    largest = torch.zeros(m, m, dtype=stacked.dtype, device=stacked.device)
    for i, b in enumerate(bases):
        if b.shape[1] == 0 or stacked.shape[1] == 0:
            continue
        cosines = (b.T @ stacked).abs().amax(dim=0)  # best match of each of the others' vectors
        largest[i].scatter_reduce_(0, owner, cosines, reduce="amax")
    largest = torch.maximum(largest, largest.T)  # the same pairs either way; equal to the last bit
    return torch.rad2deg(torch.arccos(largest.clamp(0.0, 1.0)))


def proximity_to(basis: torch.Tensor, others: torch.Tensor, widths: np.ndarray) -> np.ndarray:
    """One client's row of proximity_matrix against clients whose bases stand side by side in
    `others` (`widths` columns each): the smallest angle (degrees) between a vector of its basis and
    one of each other's."""
    largest = torch.zeros(len(widths), dtype=torch.float64, device=others.device)
    if basis.shape[1] and others.shape[1]:
        owner = torch.repeat_interleave(torch.arange(len(widths)), torch.as_tensor(widths)).to(others.device)
        largest.scatter_reduce_(0, owner, (basis.T @ others).abs().amax(dim=0), reduce="amax")
    return torch.rad2deg(torch.arccos(largest.clamp(0.0, 1.0))).cpu().numpy()


class PACFL(ClusterModels):
    """PACFL: clients clustered once, before training, by the principal angles between their data subspaces.

    Round 0, before anyone trains: every client computes its basis (`client_subspace`, p =
    `basis` singular vectors per label) and sends it (counted as off-round traffic up); the
    server builds the proximity matrix A (`proximity_matrix`) and clusters it by agglomerative
    clustering cut where the merge height exceeds `threshold` degrees (or into `clusters`
    clusters); every cluster starts from the initial model and runs FedAvg among its members.

    Readings, where paper and code leave a choice:
    - The proximity is the authors' code's: the smallest angle between any basis vector of one
      client and any of the other, arccos(max |u_a·w_b|). Their code takes arccos of the signed
      products, so a pair of vectors pointing in opposite directions (the same line; singular
      vectors have arbitrary signs) counts as 180° apart; we take |·|, which makes the measure
      independent of the SVD's sign convention, as a principal angle is.
    - Per label, the authors' code keeps p vectors, but on Dirichlet partitions it gives each
      label a share of a budget of 20 vectors by its frequency; we keep p per label everywhere.
    - The inputs are the scenario's standardized inputs (the authors use the raw pixels).
    - The clustering is scipy's, with the authors' linkage names (their `average` is WPGMA);
      it merges while the smallest proximity is at most the threshold, as their loop does.

    What it can see: the subspaces of the inputs of each label, without the label. Clients whose
    groups differ in P(x) or P(x|y) (rotations, label skew) get apart; clients whose groups differ
    only in which label an input has (label swap, concept shift) hold the same input subspaces
    and are not told apart (they end in one cluster): PACFL addresses label and feature skew."""

    # The participants' bases, side by side, and each one's width: what a new client is compared with.
    checkpoint = (*ClusterModels.checkpoint, "clustered", "proximity", "bases", "widths")

    @classmethod
    def check_hyperparams(cls, params):
        return {"clusters": 2}

    def __init__(self, ctx):
        super().__init__(ctx, 1, np.zeros(ctx.num_clients, dtype=np.int64))
        self.clustered = False
        self.proximity = torch.full((ctx.num_clients, ctx.num_clients), float("nan"), dtype=torch.float64,
                                    device=ctx.device)
        self._angles: dict[str, float] = {}
        self.bases = torch.zeros(int(np.prod(ctx.data.input_shape)), 0, dtype=torch.float32, device=ctx.device)
        self.widths = np.zeros(ctx.num_clients, dtype=np.int64)

    def round_start(self, sampled: np.ndarray) -> None:
        self._angles = {}
        if self.clustered:
            return
        answers = self.ctx.ask({client: Payload(meta={"question": "subspace"}) for client in range(self.ctx.num_clients)})
        # The server computes in float64 from what arrived.
        sent = [answers[c].tensors["basis"] for c in sorted(answers)]
        self.proximity = proximity_matrix([b.to(torch.float64) for b in sent])
        self.bases, self.widths = torch.cat(sent, dim=1), np.array([b.shape[1] for b in sent], dtype=np.int64)
        labels = self._cluster(self.proximity.cpu().numpy())
        self.centers = self.ctx.init.repeat(int(labels.max()) + 1, 1)
        self.clusters = labels
        self.clustered = True
        off = self.proximity[~torch.eye(self.ctx.num_clients, dtype=torch.bool, device=self.proximity.device)]
        if len(off):
            self._angles = {"pacfl_angle_min": float(off.min()), "pacfl_angle_median": float(off.median()),
                            "pacfl_angle_max": float(off.max())}

    newcomer_rule = ("sends the subspace of its data, as every client did in the clustering round, and joins the "
                     "cluster of the smallest mean proximity (principal angle) to its members; served that cluster's "
                     "model")

    def place(self, newcomers: Context) -> Placement:
        n = newcomers.num_clients
        answers = newcomers.ask({c: Payload(meta={"question": "subspace"}) for c in range(n)})
        clusters = np.zeros(n, dtype=np.int64)
        if self.clustered:
            theirs = self.bases.to(torch.float64)
            for c, answer in answers.items():
                angles = proximity_to(answer.tensors["basis"].to(torch.float64), theirs, self.widths)
                means = [angles[self.clusters == k].mean() if (self.clusters == k).any() else np.inf
                         for k in range(self.num_clusters)]
                clusters[c] = int(np.argmin(means))
        return self.served(newcomers, clusters, list(self.centers), clusters)

    @classmethod
    def query(cls, view: ClientView, payload: Payload, trained: None, scratch: None) -> Update:
        """A client's answer in the clustering round: its data's subspace, sent as float32 like
        every upload."""
        if payload.meta.get("question") != "subspace":
            return super().query(view, payload, trained, scratch)
        return view.answer({"basis": client_subspace(view, view.hp.basis).to(torch.float32)})

    def _cluster(self, proximity: np.ndarray) -> np.ndarray:
        # The proximity is symmetric by construction (see proximity_matrix).
        if self.hp.clusters is not None:
            return cut_dendrogram(proximity, _SCIPY_LINKAGE[self.hp.linkage], n_clusters=self.hp.clusters)
        return cut_dendrogram(proximity, _SCIPY_LINKAGE[self.hp.linkage], distance_threshold=self.hp.threshold)

    def clustering_hint(self, rounds, kind: str) -> str | None:
        """The angles are the data's, not a scale the threshold knows: the authors' 4.9° (their
        CIFAR-10 value) lies below every angle between digits clients, so nothing merges."""
        if kind != SINGLETONS or self.hp.clusters is not None or "pacfl_angle_min" not in rounds:
            return None
        smallest, median = rounds["pacfl_angle_min"].min(), rounds["pacfl_angle_median"].min()
        if not smallest > self.hp.threshold:
            return None
        return (f"threshold {self.hp.threshold:g}° is below the smallest angle between two clients' subspaces "
                f"({smallest:.1f}°; median {median:.1f}°), so no two clients merge: give `clusters: K`, or a "
                f"threshold among the angles (proximity.parquet)")

    def round_metrics(self) -> dict[str, Any]:
        return {**super().round_metrics(), **self._angles}

    def eval_tables(self) -> dict[str, dict[str, np.ndarray]]:
        """The proximity matrix A (degrees) the clusters were cut from, long format: client,
        other, value."""
        return {"proximity": self.pair_table(self.proximity)}
