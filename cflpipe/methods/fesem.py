"""FeSEM — multi-center federated learning by federated stochastic EM (Long, Xie, Shen, Zhou, Wang
and Jiang 2022, "Multi-center federated learning: clients clustering for better
personalization", World Wide Web 26; seeds/004_077738407127188b.txt).

K centers Ω_k. Each round, every sampled client i starts from its center and minimizes
    α_i·L_i(ω) + (λ/m)·Dist(ω, Ω_{r_i})      (eq. 7; m = number of clients, α_i = n_i / Σ_j n_j)
then the server runs one EM step on the uploaded models:
    E-step (eq. 8): r_i = argmin_k Dist(ω_i, Ω_k)
    M-step (eq. 9): Ω_k = mean of the ω_i with r_i = k   (plain mean: the "macro" objective, eq. 6)
Initial centers (Sec. 6.1.4): the best of 20 runs of pure k-means with random initialization,
the one with the lowest intra-cluster distance.
"""

from __future__ import annotations

import numpy as np
import torch

from cflpipe.clustering import kmeans, nearest_center
from cflpipe.fl.local import Anchor
from cflpipe.fl.method import ROUND, ClientView, Context, Payload, Placement, Update, stack_updates, take_rows
from cflpipe.methods.clustered import ClusterModels
from cflpipe.fl.params import cluster_average


class FeSEM(ClusterModels):
    """FeSEM (Long et al.): K centers by stochastic EM on model weights (L2), eq. 7 local pull to the center.

    Dist is the squared L2 distance: eq. (3) is written with ‖·‖², and the M-step mean (eq. 9) is
    the minimizer of eq. (6) only for the squared distance; the E-step argmin is the same for L2
    and squared L2. The distance term is an Anchor of strength 2λ/(m·α_i) (below).

    Initialization round (round 1): the paper clusters the clients' local models, so all m
    clients train once from the common initial model (the sampled ones as usual, the others as
    off-round traffic: one model down, one up, counted), then k-means is run `init_restarts` times
    from K distinct random models as centers, and the run with the lowest intra-cluster distance
    gives the initial centers and assignment. From round 2 on: sampled clients train from their
    center; E-step and M-step use the models uploaded that round (partial participation: the
    paper's Algorithm 1 uses all m local models; clients not sampled keep their assignment, and
    a center nobody updated keeps its value).

    Readings, noted here as the spec asks:
    - Eq. (7) weights the loss by α_i = n_i / n. Minimizing α_i·L_i + (λ/m)·Dist with SGD at the
      run's lr would shrink every loss step by α_i (≈ 1/m); the same minimizer is L_i + λ/(m·α_i)·Dist,
      which keeps the run's lr meaning what it means for every other method, so the pull's gradient
      coefficient is 2λ/(m·α_i) (≈ 2λ for equal clients). `loss_weight: none` is the unweighted
      L_i + (λ/m)·Dist (coefficient 2λ/m ≈ 0.001-0.01: the pull nearly off).
    - The paper sets N = 1 local step for FeSEM (Sec. 6.1.4) but trains "5 epochs" per round
      (Sec. 6.1.2); here the shared training block's local budget applies to every method.
    - λ is not given in the paper; 0.1 is the authors' code's regularization weight (and the
      paper's FedProx μ).
    - The authors' code starts from a random first clustering (uniform random points stand in
      for the client models); the paper's text — k-means on the clients' models — is followed.
    What it needs: the E-step does not move a client away from the center it trained from
    (pulled towards it), so the first clustering, of models one round from a common start, is
    the one the run keeps. It recovers groups when that first round's local training tells them
    apart better than the label skew inside them does (docs/robustness.md); `cflpipe validate`
    warns below 20 local steps on label-skewed groups."""

    @classmethod
    def check_hyperparams(cls, params):
        return {"clusters": 2, "init_restarts": 2}

    checkpoint = (*ClusterModels.checkpoint, "initialized")

    def __init__(self, ctx: Context):
        super().__init__(ctx, ctx.hp.clusters, np.zeros(ctx.num_clients, dtype=np.int64))
        self.initialized = False
        self._off_round: dict[int, torch.Tensor] = {}

    def cluster_payload(self, client: int) -> Payload:
        # The pull's strength depends on the client's share of all training data, which the
        # server knows: it travels with the center (a scalar, not counted as bytes).
        payload = super().cluster_payload(client)
        payload.meta["pull"] = self.pull_strength(client)
        return payload

    @classmethod
    def client_anchors(cls, view: ClientView, payload: Payload) -> list[Anchor]:
        return [Anchor(payload.tensors["model"], payload.meta["pull"])]

    def _asked(self, client: int) -> Payload:
        """What a client not sampled in the first round is asked to train: its center, as in a round."""
        payload = self.cluster_payload(client)
        payload.meta["question"] = ROUND
        return payload

    def pull_strength(self, client: int) -> float:
        """Gradient coefficient of the distance term: 2λ/m, divided by α_i = n_i/n under eq. 7."""
        strength = 2.0 * self.hp.lam / self.ctx.num_clients
        if self.hp.loss_weight == "eq7":
            sizes = self.ctx.train_sizes()
            strength /= max(float(sizes[client]), 1.0) / float(sizes.sum())
        return strength

    def round_start(self, sampled: np.ndarray) -> None:
        self._off_round = {}
        if self.initialized:
            return
        chosen = set(int(c) for c in sampled)
        answers = self.ctx.ask({c: self._asked(c) for c in range(self.ctx.num_clients) if c not in chosen})
        self._off_round = {c: answer.tensors["model"] for c, answer in answers.items()}

    newcomer_rule = ("trains the mean of the centers for one round's local steps (no center to pull it yet) and "
                     "joins the nearest center (L2: FeSEM's E-step), served that center's model")

    def place(self, newcomers: Context) -> Placement:
        return self.place_nearest(newcomers)

    def cluster_aggregate(self, updates: dict[int, Update]) -> None:
        if not self.initialized:
            self._initialize(updates)
            return
        if not updates:
            return
        clients, vectors, _ = stack_updates(updates)
        labels = nearest_center(vectors, self.centers)  # E-step
        self.clusters[clients] = labels
        ones = torch.ones(len(clients), dtype=vectors.dtype, device=vectors.device)
        means, present = cluster_average(vectors, torch.from_numpy(labels), ones, self.num_clusters)
        self.centers[present] = means[present]  # M-step

    def _initialize(self, updates: dict[int, Update]) -> None:
        models = {c: u.tensors["model"] for c, u in updates.items()}
        models.update(self._off_round)
        self._off_round = {}
        if len(models) < self.num_clusters:
            return  # too few clients trained (divergence): try again next round
        clients, vectors = take_rows(models)
        result = kmeans(vectors, self.num_clusters, seed=self.ctx.rng(0xFE5E), n_init=self.hp.init_restarts,
                        init="random", max_iter=self.hp.init_iter)
        self.centers = result.centers.to(vectors.dtype).clone()
        labels = np.zeros(self.ctx.num_clients, dtype=np.int64)
        labels[clients] = result.labels
        missing = np.setdiff1d(np.arange(self.ctx.num_clients), clients)
        if len(missing):  # diverged in the initialization round: center nearest to the initial model
            labels[missing] = nearest_center(self.ctx.init[None, :], self.centers)[0]
        self.clusters = labels
        self.initialized = True
