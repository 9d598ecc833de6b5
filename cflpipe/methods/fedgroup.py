"""FedGroup (Duan, Liu, Chen, Tan, Li, Lei and Wen 2021, "FedGroup: efficient federated learning
via decomposed similarity-based clustering", ISPA 2021; reference code github.com/morningD/FlexCFL).

Static clustering once, before training: a random subset of min(α·K, m) clients pre-trains from
the initial model; the server stacks their updates ΔW, takes the top-K singular directions of
ΔW (SVD), describes every client by the cosines of its update with those directions (the
decomposed cosine similarity, whose Euclidean distances are the EDC measure) and groups the
clients by k-means on these K-dimensional rows. Each group then runs FedAvg on its own model.
A client that was not in the pre-training subset is cold-started when first sampled: it
pre-trains from the initial model and joins the group whose latest update direction is most
cosine-similar to its update.
"""

from __future__ import annotations

import numpy as np
import torch

from cflpipe.clustering import cosine_similarity_matrix, decomposed_cosine_similarity, kmeans
from cflpipe.fl.method import ClientView, Context, Payload, Placement, Update
from cflpipe.fl.plan import ClientPlan
from cflpipe.methods.clustered import UNASSIGNED, ClusterModels
from cflpipe.fl.params import cluster_average

# The question of pre-training (the first groups' and a cold start's).
PRETRAIN = "pretrain"


class FedGroup(ClusterModels):
    """FedGroup (Duan et al.): static groups by k-means on decomposed cosine similarities (EDC) of pre-training updates.

    Pre-training happens in round 1, before that round's training: the chosen clients train once
    from the initial model ω_0 and upload their updates (off-round traffic: one model down, one
    update up, counted). Group k starts from the plain mean of its members' pre-trained models
    and keeps a direction: initially the mean of its members' pre-training updates, afterwards
    its latest aggregated update (as the reference code's `latest_updates`). Newcomers (clients
    outside the pre-training subset) are cold-started when first sampled — pre-train from ω_0
    (counted), then join argmax_k cos(Δ_new, direction_k) — and then train with that group in
    the same round. Until then they have no group: they are reported as cluster −1 and evaluated
    with the mean of the group models (the reference code's auxiliary global model). Aggregation
    inside a group is sample-weighted FedAvg. The reference code's optional inter-group
    aggregation (group_agg_lr) is not implemented: the brief asks for group-wise FedAvg."""

    @classmethod
    def check_hyperparams(cls, params):
        return {"clusters": 2, "pretrain_scale": 2, "pretrain_steps": 2}

    checkpoint = (*ClusterModels.checkpoint, "directions", "initialized")

    def __init__(self, ctx: Context):
        super().__init__(ctx, ctx.hp.clusters, np.full(ctx.num_clients, UNASSIGNED, dtype=np.int64))
        self.directions = torch.zeros_like(self.centers)
        self.initialized = False

    # ------------------------------------------------------------------ round start: pre-training

    def _pretrain(self, clients: np.ndarray) -> tuple[np.ndarray, torch.Tensor, torch.Tensor]:
        answers = self._pretrained(self.ctx, clients)
        done = [int(c) for c in clients if int(c) in answers]
        vectors = [answers[c].tensors["model"] for c in done]
        if not vectors:
            empty = self.ctx.init.new_zeros((0, self.ctx.init.numel()))
            return np.zeros(0, dtype=np.int64), empty, empty
        models = torch.stack(vectors)
        return np.array(done, dtype=np.int64), models, models - self.ctx.init

    def round_start(self, sampled: np.ndarray) -> None:
        if not self.initialized:
            m, k = self.ctx.num_clients, self.num_clusters
            chosen = np.sort(self.ctx.rng(0xF6).choice(m, size=min(self.hp.pretrain_scale * k, m), replace=False))
            clients, models, deltas = self._pretrain(chosen)
            if len(clients) < k:
                return  # too few usable pre-training updates (divergence): try again next round
            features = decomposed_cosine_similarity(deltas, k)
            result = kmeans(features, k, seed=self.ctx.rng(0xF7), n_init=self.hp.kmeans_init,
                            init="k-means++", max_iter=self.hp.kmeans_iter)
            labels = torch.from_numpy(result.labels)
            ones = torch.ones(len(clients), dtype=models.dtype, device=models.device)
            means, present = cluster_average(models, labels, ones, k)
            directions, _ = cluster_average(deltas, labels, ones, k)
            self.centers[present] = means[present]
            self.directions[present] = directions[present]
            self.clusters[clients] = result.labels
            self.initialized = True
        newcomers = [int(c) for c in sampled if self.clusters[int(c)] < 0]
        if newcomers:
            clients, _, deltas = self._pretrain(np.array(newcomers, dtype=np.int64))
            if len(clients):
                similarity = cosine_similarity_matrix(deltas, self.directions)
                self.clusters[clients] = similarity.argmax(dim=1).cpu().numpy()

    @staticmethod
    def _pretrained(ctx: Context, clients: np.ndarray) -> dict[int, Update]:
        payload = Payload({"model": ctx.init}, {"question": PRETRAIN})
        return ctx.ask({int(c): payload for c in clients})

    @classmethod
    def query_plan(cls, view: ClientView, payload: Payload) -> tuple[ClientPlan | None, None]:
        """Pre-training: a few steps from the initial model it is sent (then query sends it back)."""
        if payload.meta.get("question") != PRETRAIN:
            return super().query_plan(view, payload)
        return ClientPlan(payload.tensors["model"], steps=view.hp.pretrain_steps), None

    newcomer_rule = ("pre-trains the initial model for pretrain_steps and joins the group whose latest update "
                     "direction is most cosine-similar to its update (FedGroup's cold start), served that group's model")

    def place(self, newcomers: Context) -> Placement:
        n = newcomers.num_clients
        clusters = np.full(n, UNASSIGNED, dtype=np.int64)
        models = [*self.centers, self._auxiliary()]
        if not self.initialized:  # no group has a direction yet: served the groups' mean
            return self.served(newcomers, clusters, models, np.full(n, len(self.centers)))
        answers = self._pretrained(newcomers, np.arange(n))
        done = sorted(answers)
        if done:
            deltas = torch.stack([answers[c].tensors["model"] for c in done]) - newcomers.init
            clusters[done] = cosine_similarity_matrix(deltas, self.directions).argmax(dim=1).cpu().numpy()
        return self.served(newcomers, clusters, models, np.where(clusters >= 0, clusters, len(self.centers)))

    # ------------------------------------------------------------------ training

    def cluster_payload(self, client: int) -> Payload:
        if self.clusters[client] == UNASSIGNED:  # pre-training or cold start diverged: train the group mean
            return Payload({"model": self._auxiliary()})
        return super().cluster_payload(client)

    def cluster_aggregate(self, updates: dict[int, Update]) -> None:
        updates = {c: u for c, u in updates.items() if self.clusters[c] >= 0}
        if not updates:
            return
        trained = torch.from_numpy(np.unique(self.clusters[list(updates)])).to(self.centers.device)
        before = self.centers[trained].clone()
        super().cluster_aggregate(updates)
        self.directions[trained] = self.centers[trained] - before  # each group's latest update

    def _auxiliary(self) -> torch.Tensor:
        return self.centers.mean(dim=0)

    # ------------------------------------------------------------------ evaluation

    def cluster_models(self, clients: np.ndarray | None = None) -> tuple[list[torch.Tensor], np.ndarray]:
        """Clients not yet in a group (never sampled) are evaluated with the groups' mean."""
        models = list(self.centers)
        index = self.clusters.copy()
        if (index < 0).any():
            index[index < 0] = len(models)
            models.append(self._auxiliary())
        return models, index
