"""ICFL — incremental clustered federated learning (Yan, Tong and Wang, "Clustered Federated
Learning in Heterogeneous Environment", IEEE TNNLS 2023), reconstructed from the one public
implementation, LINs-lab/FedRC's `ICFLAggregator`, which was written from the paper. The paper's
method section could not be read here (closed access, no author code), so cflpipe labels the
method for what it is; docs/methods-reconstructed.md says what is known and where this departs.

Clients start in a pool S_0 that trains a global model θ_0. Each round every cluster's updates
Δ_i = w_i − (the model client i was sent) form an affinity matrix A_ij = cos(Δ_i, Δ_j); its
cohesion α_G = λ₁(A)/|C| (1 when all updates point one way) is held against a bar that rises with
the round t, α_t = 1 − (e/ε₁)^{t/ε₂} with ε₂ = ln(1 − α₀)/(1 − ln ε₁). A cluster below the bar is
bisected by 2-means on the top two singular vectors of A. The pool is split once (its sampled
clients form the first two clusters; the others stay in the pool); after that each sampled pool
client joins the cluster whose updates its own is most similar to.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from sklearn.cluster import KMeans

from cflpipe.clustering import cosine_similarity_matrix
from cflpipe.errors import SpecError
from cflpipe.fl.method import Context, Payload, Placement, Update, stack_updates
from cflpipe.fl.params import cluster_average, weighted_average
from cflpipe.methods.clustered import ADAPT, ClusterModels
from cflpipe.seeds import seed32

POOL = 0  # the cluster of the clients not clustered yet; its model is the global model θ_0
_BISECT = 0x1CF1  # purpose of the server randomness that seeds a bisection's 2-means


def split_bar(round_number: int, eps1: float, alpha0: float) -> float:
    """α_t = 1 − (e/ε₁)^{t/ε₂}, ε₂ = ln(1 − α₀)/(1 − ln ε₁): 0 in round 0, α₀ at t = ε₂², → 1."""
    eps2 = math.log(1.0 - alpha0) / (1.0 - math.log(eps1))
    return 1.0 - (math.e / eps1) ** (round_number / eps2)


def cohesion(affinity: np.ndarray) -> float:
    """α_G = λ₁(A)/|C|, the largest singular value of the affinity matrix over its size; 1 for
    fewer than two clients."""
    n = len(affinity)
    return 1.0 if n < 2 else float(np.linalg.svd(affinity, compute_uv=False)[0]) / n


def bisect(affinity: np.ndarray, seed: int) -> np.ndarray:
    """0/1 halves of the clients of an affinity matrix: 2-means on its top two singular vectors
    (the columns of V, one row per client)."""
    _, _, vt = np.linalg.svd(affinity)
    embedding = vt[:2].T
    return KMeans(n_clusters=2, n_init=10, random_state=seed).fit_predict(embedding).astype(np.int64)


class ICFL(ClusterModels):
    """ICFL (reconstructed from FedRC's implementation): a pool of unclustered clients; clusters bisected when the cohesion of their updates falls below a rising bar.

    The FedRC reading (aggregator.py, ICFLAggregator), with its four defects fixed:
    A. the bisection embeds the clients by the top two singular vectors V[:, :2] (FedRC took the
       first two rows of V);
    B. a pool client joins the *most* similar cluster (FedRC's search never updated its maximum
       and always chose the last cluster);
    C. similar to a cluster's mean update (the average of its members' latest updates; FedRC
       compared an update with the cluster's whole model, every other similarity in the method
       being update against update);
    D. the incremental assignment runs (FedRC read an attribute that does not exist, so it
       crashed or, with every client sampled, never ran).
    The 2-means is seeded from the run (FedRC's was not), and the engine samples clients_per_round
    over all clients (FedRC sampled a share of each cluster). As in FedRC: a cluster's split test
    reads its members' latest updates of any round; a client trains from the model it holds, the
    one broadcast to it at the end of the last round it took part in (sent here at the start of
    its next round: the same bytes); θ_k (k ≥ 1) is the sample-weighted mean of every member's
    model, this round's trained one or the one it holds, θ_0 that of the round's pool clients and
    of every θ_k weighted by its members' samples. rounds.parquet records α_t (`icfl_alpha_t`), each cluster's α_G where it was tested
    (`icfl_alpha_g`, NaN elsewhere) and the number of clusters (`icfl_clusters`, the pool
    included while it has members)."""

    checkpoint = (*ClusterModels.checkpoint, "held", "latest_update", "has_update", "samples")

    @classmethod
    def check_hyperparams(cls, params: type) -> dict[str, Any]:
        return {"eps1": 100.0}  # α_t ≈ 1 from round 1: the pool splits at once

    def __init__(self, ctx: Context):
        super().__init__(ctx, 1, np.full(ctx.num_clients, POOL, dtype=np.int64))
        if self.awcfl_beta is not None or self.mcfl:  # a plugin's subclass gets them from the cluster-model base
            raise SpecError(f"methods.{ctx.method}: ICFL takes neither AWCFL's mixing nor MCFL's selection: its "
                            f"clients hold the model broadcast to them and its first model is the pool's")
        p = ctx.init.numel()
        # The model each client holds: the initial one, then its cluster's model broadcast to it at
        # the end of each round it took part in (what it trains from and counts with in aggregation).
        self.held = ctx.table("held", ctx.init)
        self.latest_update = ctx.table("latest_update", ctx.init.new_zeros(p))  # each client's latest update Δ_i
        self.has_update = np.zeros(ctx.num_clients, dtype=bool)
        self.samples = np.zeros(ctx.num_clients, dtype=np.int64)  # n_i, known once a client uploaded
        self._alpha_g: list[float] = []

    def cluster_payload(self, client: int) -> Payload:
        return Payload({"model": self.held[client]})

    def cluster_aggregate(self, updates: dict[int, Update]) -> None:
        self._alpha_g = [float("nan")] * self.num_clusters
        if not updates:
            return
        clients, models, _ = stack_updates(updates)
        rows = torch.from_numpy(clients).to(self.held.device)
        self.latest_update[rows] = models - self.held[rows]
        self.has_update[clients] = True
        self.samples[clients] = [updates[int(c)].n for c in clients]
        round_pool = clients[self.clusters[clients] == POOL]
        existing = self.num_clusters
        for k in range(existing):
            if k == POOL and existing > 1:
                self._join_nearest(round_pool)
                continue
            members = round_pool if k == POOL else np.nonzero((self.clusters == k) & self.has_update)[0]
            self._split_test(k, members)
        self.held[rows] = models  # every member's model: the round's trained ones, the others' held ones
        self._average(self.held, round_pool)
        self.held[rows] = self.centers[torch.from_numpy(self.clusters[clients]).to(self.held.device)]  # broadcast

    def _join_nearest(self, pool_clients: np.ndarray) -> None:
        """Each of the round's pool clients joins the cluster whose mean update is most similar
        to its own (defects B, C and D fixed)."""
        if not len(pool_clients):
            return
        rows = self.latest_update[torch.from_numpy(pool_clients).to(self.held.device)]
        self.clusters[pool_clients] = self._nearest_direction(rows)

    def _nearest_direction(self, updates: torch.Tensor) -> np.ndarray:
        """The cluster (not the pool) whose members' mean latest update is the most cosine-similar
        to each of `updates`."""
        device = self.held.device
        known = np.nonzero(self.has_update)[0]
        means, _ = cluster_average(self.latest_update[torch.from_numpy(known).to(device)],
                                   torch.from_numpy(self.clusters[known]), torch.ones(len(known), device=device),
                                   self.num_clusters)
        return 1 + cosine_similarity_matrix(updates, means[1:]).argmax(dim=1).cpu().numpy()

    newcomer_rule = ("trains the model a client holds before it takes part (the initial one) for one round's local "
                     "steps and, once clusters exist, joins the one whose members' mean latest update is the most "
                     "cosine-similar to its update, as ICFL's pool clients do; served that cluster's model, else "
                     "the pool's")

    def place(self, newcomers: Context) -> Placement:
        n = newcomers.num_clients
        clusters = np.full(n, POOL, dtype=np.int64)
        if self.num_clusters > 1:
            answers = newcomers.ask({c: Payload({"model": newcomers.init}, {"question": ADAPT}) for c in range(n)})
            done = sorted(answers)
            if done:
                updates = torch.stack([answers[c].tensors["model"] for c in done]) - newcomers.init
                clusters[done] = self._nearest_direction(updates)
        return self.served(newcomers, clusters, list(self.centers), clusters)

    def _split_test(self, k: int, members: np.ndarray) -> None:
        affinity = cosine_similarity_matrix(self.latest_update[torch.from_numpy(members).to(self.held.device)])
        affinity = affinity.double().cpu().numpy()
        alpha_g = cohesion(affinity)
        self._alpha_g[k] = alpha_g
        if len(members) < 2 or alpha_g >= split_bar(self.ctx.round, self.hp.eps1, self.hp.alpha0):
            return
        halves = bisect(affinity, seed32(self.ctx.seed, self.ctx.round, _BISECT, k))
        if halves.min() == halves.max():  # 2-means found one group (identical updates): nothing to split
            return
        if k == POOL:  # the round's pool clients form the first two clusters; the others stay in the pool
            self._new_cluster(members[halves == 0])
            self._new_cluster(members[halves == 1])
        else:
            self._new_cluster(members[halves == 1])

    def _new_cluster(self, members: np.ndarray) -> None:
        self.clusters[members] = self.num_clusters
        self.centers = torch.cat([self.centers, self.centers[:1].clone()])  # set by _average this round
        self._alpha_g.append(float("nan"))

    def _average(self, current: torch.Tensor, round_pool: np.ndarray) -> None:
        """θ_k: the sample-weighted mean of all members' `current` models; θ_0: of the round's pool
        clients' models and of every θ_k, weighted by its members' samples (FedRC's)."""
        labels = torch.from_numpy(self.clusters)
        samples = torch.as_tensor(self.samples, dtype=current.dtype, device=current.device)
        means, _ = cluster_average(current, labels, samples, self.num_clusters)  # members have uploaded: n_i > 0
        self.centers[1:] = means[1:]
        pool = torch.from_numpy(round_pool[self.clusters[round_pool] == POOL]).to(current.device)
        sizes = torch.zeros(self.num_clusters, dtype=current.dtype, device=current.device)
        sizes.index_add_(0, labels.to(current.device), samples)
        weights = torch.cat([samples[pool], sizes[1:]])
        if len(weights):
            self.centers[POOL] = weighted_average(torch.cat([current[pool], self.centers[1:]]), weights)

    def round_metrics(self) -> dict[str, Any]:
        pooled = int((self.clusters == POOL).any())
        return {"icfl_alpha_t": split_bar(self.ctx.round, self.hp.eps1, self.hp.alpha0),
                "icfl_alpha_g": list(self._alpha_g),
                "icfl_clusters": self.num_clusters - 1 + pooled}
