"""The cluster-model base: K cluster models and an assignment, with AWCFL's inter-cluster mixing
and MCFL's selection by data (seed paper 001) as options every subclass has.

A subclass overrides the `cluster_*` hooks (its own payload, aggregation and evaluation models;
on the client side, over the client's view, its anchors and its upload); the base wraps them with
the options the variant's hyper-parameters ask for:
    AWCFL (hyper-parameter beta):  after each aggregation C_k ← β/(K−1)·Σ_{j≠k} C_j + (1−β)·C_k
    MCFL (feature_samples):        all K models travel down, each client uploads the mean of n
                                   sampled training inputs, and any test data is evaluated with
                                   the cluster model whose members' feature mean is nearest (L2)
Every cluster method has its `<name>_awcfl` and `<name>_mcfl` variants: the built-ins' are
declared with each method (`cluster_options` in its `X_params.py`), a plugin's subclass registers them with itself (see `variants`)."""

from __future__ import annotations


from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from cflpipe.clustering import nearest_center
from cflpipe.fl.method import (SERVE, Capabilities, ClientView, Context, Method, Payload, Placement, Update,
                               stack_updates)
from cflpipe.fl.params import cluster_average
from cflpipe.fl.plan import ClientPlan, Plans, Results
from cflpipe.fl.predictors import Models, Selected
from cflpipe.fl.local import Anchor
from cflpipe.methods.intercluster_params import AWCFLParams, MCFLParams, awcfl_collapses, cluster_options
from cflpipe.methods.intercluster import awcfl_mix, sample_mean

# Purposes of the server randomness that samples MCFL's feature means.
_TRAIN_MEAN, _TEST_MEAN = 0x3E, 0x3F

# A client's cluster before it has one (FedGroup's clients until they are first sampled): its
# uploads count towards no cluster.
UNASSIGNED = -1
# A new client's round of local steps from the model it is sent (ROUND, Method's: as in a round).
ADAPT = "adapt"
# Asked with the cluster models, a client sends each one's mean loss on its training data
# (SR-FCA's clustering, IFCA's and SR-FCA's placement of new clients).
LOSSES = "losses"


def asked_losses(ctx: Context, models: torch.Tensor, clients: np.ndarray | None = None, *,
                 counted: bool = True) -> np.ndarray:
    """(clients × models) mean training cross-entropy of each model on each client's data, as the
    clients answer LOSSES (Context.ask; of `clients` in their order, or of all): NaN for a client
    without training data or left out by divergence."""
    which = np.arange(ctx.num_clients) if clients is None else np.asarray(clients, dtype=np.int64)
    payload = Payload({"models": models}, {"question": LOSSES})
    answers = ctx.ask({int(c): payload for c in which}, counted=counted)
    out = np.full((len(which), len(models)), np.nan)
    for row, client in enumerate(which):
        answer = answers.get(int(client))
        if answer is not None:
            out[row] = answer.tensors["losses"].double().cpu().numpy()
    return out


def lowest(losses: np.ndarray) -> np.ndarray:
    """argmin over the last axis; NaN (no data, diverged model) counts as +inf, ties go to the
    lowest index."""
    return np.argmin(np.where(np.isnan(losses), np.inf, losses), axis=-1).astype(np.int64)


def mixture_table(weights: np.ndarray) -> dict[str, np.ndarray]:
    """A soft method's `mixture.parquet` rows: each client's share in each cluster, long format
    (client, cluster, weight) from the (clients × clusters) weights."""
    m, k = weights.shape
    return {"client": np.repeat(np.arange(m), k), "cluster": np.tile(np.arange(k), m), "weight": weights.reshape(-1)}


def client_feature_mean(view: ClientView) -> torch.Tensor:
    """MCFL's upload: the mean of `feature_samples` of the client's training inputs."""
    x, _ = view.data()
    return sample_mean(x, view.hp.feature_samples, view.rng(_TRAIN_MEAN))


class ClusterModels(Method):
    """K cluster models; a client trains its cluster's model and each cluster averages its
    sampled members (sample-weighted). The base of Oracle and of the clustered methods."""

    capabilities = Capabilities(clustered=True)
    checkpoint = ("centers", "clusters")
    # Whether cluster_payload already sends every cluster model (IFCA's clients pick among them);
    # otherwise MCFL adds the K−1 models the client's own cluster payload lacks.
    sends_all_models: ClassVar[bool] = False
    # The family (registry.FAMILIES) of the AWCFL and MCFL variants a plugin's subclass gets.
    variant_family: ClassVar[str] = "modifier"

    # A plugin's subclass gets its variants here (the built-ins' are declared with them, `X_params.py`).
    # Called by @register while the class is being defined, before mutmut's trampoline exists.
    @classmethod
    def variants(cls, name: str) -> tuple:  # pragma: no mutate block
        return cluster_options(name)

    def __init__(self, ctx: Context, num_clusters: int, clusters: np.ndarray):
        super().__init__(ctx)
        self.centers = ctx.init.repeat(num_clusters, 1)
        self.clusters = np.asarray(clusters, dtype=np.int64).copy()
        self.awcfl_beta = self.hp.beta if isinstance(self.hp, AWCFLParams) else None
        self.mcfl = isinstance(self.hp, MCFLParams)
        if self.mcfl:
            dim = int(np.prod(ctx.data.input_shape))
            self.feature_means = torch.zeros(ctx.num_clients, dim, dtype=ctx.init.dtype, device=ctx.device)
            self.has_mean = np.zeros(ctx.num_clients, dtype=bool)
            self.checkpoint = (*type(self).checkpoint, "feature_means", "has_mean")
            self._cluster_means: tuple[torch.Tensor, np.ndarray] | None = None

    @property
    def num_clusters(self) -> int:
        return self.centers.shape[0]

    # ------------------------------------------------------------------ subclass hooks

    def cluster_payload(self, client: int) -> Payload:
        return Payload({"model": self.centers[self.clusters[client]]})

    @classmethod
    def client_anchors(cls, view: ClientView, payload: Payload) -> list[Anchor]:
        """What pulls the client's local objective (FeSEM: its cluster's model)."""
        return []

    @classmethod
    def cluster_client_finish(cls, view: ClientView, payload: Payload, trained: Results, scratch: Any) -> Update:
        """The client's upload; MCFL's feature mean is added to it by the base."""
        return view.update({"model": trained.vector}, trained)

    def cluster_aggregate(self, updates: dict[int, Update]) -> None:
        if not updates:
            return
        clients, vectors, weights = stack_updates(updates)
        means, present = cluster_average(vectors, torch.from_numpy(self.clusters[clients]), weights,
                                         self.num_clusters)
        self.centers[present] = means[present]

    def cluster_models(self, clients: np.ndarray | None = None) -> tuple[list[torch.Tensor], np.ndarray]:
        """The cluster models clients are evaluated with and each client's index into them;
        `clients` as in Method.predictor."""
        return list(self.centers), self.clusters.copy()

    # ------------------------------------------------------------------ the engine's hooks

    def payload(self, client: int) -> Payload:
        payload = self.cluster_payload(client)
        if self.mcfl and not self.sends_all_models:
            # MCFL selects among all K models at test time: the other K−1 travel too.
            own = self.clusters[client]
            keep = torch.arange(self.num_clusters, device=self.centers.device) != own
            payload.tensors["other_cluster_models"] = self.centers[keep]
        return payload

    @classmethod
    def client_plan(cls, view: ClientView, payload: Payload) -> tuple[Plans, Any]:
        return ClientPlan(payload.tensors["model"], cls.client_anchors(view, payload)), None

    @classmethod
    def query_plan(cls, view: ClientView, payload: Payload) -> tuple[Plans | None, Any]:
        """Asked to train outside the round: as in a round ("round": FL+HC's clustering round,
        FeSEM's initialization, its pull included), or, a new client, one round's local steps from
        the model it is sent ("adapt"); `query` sends the trained model back."""
        if payload.meta.get("question") == ADAPT:
            return ClientPlan(payload.tensors["model"]), None
        return super().query_plan(view, payload)  # ROUND: client_plan

    @classmethod
    def query(cls, view: ClientView, payload: Payload, trained: Results | None, scratch: Any) -> Update:
        if payload.meta.get("question") == LOSSES:  # each model's mean training cross-entropy
            models = payload.tensors["models"]
            x, y = view.data()
            if not len(y):
                return view.answer({"losses": torch.full((len(models),), float("nan"))})
            logits = view.apply(models, x, chunk=view.training.eval_batch_size).float()  # (models × n × classes)
            per_sample = F.cross_entropy(logits.flatten(0, 1), y.repeat(len(models)), reduction="none")
            return view.answer({"losses": per_sample.view(len(models), -1).mean(1)})
        if trained is None:
            return super().query(view, payload, trained, scratch)
        return view.update({"model": trained.vector}, trained)

    def place_by_loss(self, newcomers: Context, models: torch.Tensor) -> Placement:
        """A new client receives the cluster models, sends its mean training loss under each (its
        method's `query` answers the question "losses") and is served the one of lowest loss,
        which it holds already; one without training data is served the first."""
        clusters = lowest(asked_losses(newcomers, models))
        if self.mcfl:  # MCFL's selection by the data, as for the participants
            return Placement(clusters, Selected(list(models), clusters, self.nearest_feature_mean))
        return Placement(clusters, Models(list(models), clusters))

    def served(self, newcomers: Context, clusters: np.ndarray, models: list[torch.Tensor],
               index: np.ndarray) -> Placement:
        """Method.served; with MCFL every new client receives every model (counted) and is
        evaluated by MCFL's selection by the data, as the participants are."""
        if not self.mcfl:
            return super().served(newcomers, clusters, models, index)
        every = torch.stack(list(models))
        newcomers.ask({c: Payload({"models": every}, {"question": SERVE}) for c in range(newcomers.num_clients)})
        return Placement(np.asarray(clusters, dtype=np.int64),
                         Selected(list(models), np.asarray(index, dtype=np.int64), self.nearest_feature_mean))

    def place_nearest(self, newcomers: Context) -> Placement:
        """A new client trains the mean of the cluster models for one round's local steps and
        joins the cluster whose model is nearest (L2) to what it trained, whose model then serves
        it; one whose training diverged is served the mean, in no cluster."""
        n, start = newcomers.num_clients, self.centers.mean(0)
        answers = newcomers.ask({c: Payload({"model": start}, {"question": ADAPT}) for c in range(n)})
        clusters = np.full(n, UNASSIGNED, dtype=np.int64)
        for c, answer in answers.items():
            clusters[c] = int(nearest_center(answer.tensors["model"][None], self.centers)[0])
        models = [*self.centers, start]
        return self.served(newcomers, clusters, models, np.where(clusters >= 0, clusters, len(self.centers)))

    @classmethod
    def client_finish(cls, view: ClientView, payload: Payload, trained: Results, scratch: Any) -> Update:
        update = cls.cluster_client_finish(view, payload, trained, scratch)
        if isinstance(view.hp, MCFLParams):  # the client's feature mean goes up with its model
            update.tensors["feature_mean"] = client_feature_mean(view)
        return update

    def aggregate(self, updates: dict[int, Update]) -> None:
        self.cluster_aggregate(updates)
        if self.awcfl_beta is not None and updates:  # a round whose updates were all skipped: nothing to mix
            self.centers = awcfl_mix(self.centers, self.awcfl_beta)
        if self.mcfl:
            for client, update in updates.items():
                self.feature_means[client] = update.tensors["feature_mean"]
                self.has_mean[client] = True
            self._cluster_means = None

    def predictor(self, clients: np.ndarray | None = None) -> Models | Selected:
        models, index = self.cluster_models(clients)
        if not self.mcfl:
            return Models(models, index)
        # Assignments may change at evaluation (IFCA re-picks by loss): the means are computed
        # again once per evaluation, not once per test set.
        self._cluster_means = self.cluster_feature_means()
        return Selected(models, index, self.nearest_feature_mean)

    def assignment(self) -> np.ndarray | None:
        return self.clusters.copy()

    def collapse_note(self, rounds) -> str | None:
        # Eq. 2 mixes every cluster model, whether or not clients are in it: K is the method's fixed
        # K where it has one, else the clusters its clustering found (CFL, PACFL by threshold: as
        # many models as clusters). Read from the rounds table and the hyper-parameters, never the
        # state: outputs are rebuilt from a last checkpoint that holds no models. The clients must
        # still be in several clusters for "one model for all" to be news.
        counts = rounds["n_clusters"].dropna() if "n_clusters" in rounds else rounds[:0]
        if self.awcfl_beta is None or not len(counts) or int(counts.iloc[-1]) < 2:
            return None
        fixed = self.capabilities.k_param and getattr(self.hp, self.capabilities.k_param, None)
        k = int(fixed) if fixed else int(counts.iloc[-1])
        if awcfl_collapses(self.awcfl_beta, k):
            return (f"collapsed to one model by the end: AWCFL's Eq. 2 at beta {self.awcfl_beta:g} with {k} clusters "
                    f"(beta = (K-1)/K) gives every cluster the same model, the mean of all: its final figures are "
                    f"those of one averaged model for all")
        return None

    # ------------------------------------------------------------------ MCFL

    def cluster_feature_means(self) -> tuple[torch.Tensor, np.ndarray]:
        """Each cluster's feature mean (average of its members' uploaded means) and which
        clusters have one."""
        known = np.nonzero(self.has_mean & (self.clusters != UNASSIGNED))[0]
        onehot = torch.zeros(self.num_clusters, len(known), dtype=self.feature_means.dtype,
                             device=self.feature_means.device)
        onehot[torch.from_numpy(self.clusters[known]), torch.arange(len(known))] = 1
        counts = onehot.sum(1)
        return (onehot @ self.feature_means[known]) / counts.clamp_min(1)[:, None], (counts > 0).cpu().numpy()

    def nearest_feature_mean(self, x: torch.Tensor) -> int:
        """MCFL's choice for the inputs x: the cluster whose members' feature mean is nearest
        (L2) to a sample mean of x."""
        if self._cluster_means is None:
            self._cluster_means = self.cluster_feature_means()
        means, present = self._cluster_means
        if not present.any():
            return 0
        mu = sample_mean(x, self.hp.feature_samples, self.ctx.rng(len(x), _TEST_MEAN)).to(means.dtype)
        distances = (means - mu).norm(dim=1)
        distances[torch.from_numpy(~present).to(distances.device)] = float("inf")
        return int(distances.argmin())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if self.mcfl:
            self._cluster_means = None
