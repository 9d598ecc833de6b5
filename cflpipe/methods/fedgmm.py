"""FedGMM (Wu et al. 2023, "Personalized federated learning under mixture of distributions",
ICML 2023, arXiv 2305.01068; authors' code github.com/zshuai8/FedGMM_ICML2023:
client.py ACGMixtureClient, aggregator.py ACGCentralizedAggregator, learners/gmm.py).

A client's joint distribution is a mixture over pairs (m1, m2) of M1 Gaussian components of the
inputs and M2 shared classifiers: p_i(x, y) = Σ π_i[m1, m2]·N(z(x); μ_m1, Σ_m1)·p_m2(y | x), so
it models covariate shift (the Gaussians, over an embedding z of the inputs) and concept shift
(the classifiers) at once. Each round a sampled client runs one EM step: the E-step gives each of
its samples a responsibility r[m1, m2] ∝ π_i[m1, m2]·N(z; μ_m1, Σ_m1)·exp(−ℓ_m2(x, y)), the M-step
sets π_i to the mean of r, computes its Gaussian statistics under Σ_m2 r and trains classifier m2
on the loss weighted by Σ_m1 r; the server pools the Gaussians' moments and averages each
classifier. A client predicts with weights that depend on the input: p(y | x) = Σ_m2 w_m2(x)·
p_m2(y | x), w_m2(x) = Σ_m1 of the posterior of (m1, m2) given z(x) under π_i and the Gaussians.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from sklearn.cluster import KMeans

from cflpipe.fl.method import ClientView, Context, Method, Payload, Placement, Update, stack_updates
from cflpipe.fl.params import weighted_average
from cflpipe.fl.plan import ClientPlan, Trained
from cflpipe.fl.predictors import Mixture
from cflpipe.methods.clustered import lowest, mixture_table
from cflpipe.methods.fedem import WeightedCrossEntropy, asked_weights
from cflpipe.methods.ifca import random_models, sample_losses
from cflpipe.seeds import seed32

# Purposes of the seeded randomness (the classifiers' initializations, the GMM's k-means).
_MODELS, _KMEANS = 0xF6A, 0xF6B


# Rows converted to float64 at once (the embedding's Gram matrix, embedded inputs, densities).
ROWS_AT_ONCE = 4096


def uncentered_pca(x_flat: torch.Tensor, dimension: int) -> torch.Tensor:
    """(D × d) the top-d right singular vectors of the (rows × D) inputs, not centred (the
    authors' embedding: an SVD of the features as they are); d is at most D. The Gram matrix is
    summed in float64 over chunks of rows (no float64 copy of the inputs)."""
    gram = torch.zeros(x_flat.shape[1], x_flat.shape[1], dtype=torch.float64, device=x_flat.device)
    for i in range(0, len(x_flat), ROWS_AT_ONCE):
        chunk = x_flat[i:i + ROWS_AT_ONCE].double()
        gram += chunk.T @ chunk
    values, vectors = torch.linalg.eigh(gram)  # ascending
    return vectors[:, torch.argsort(values, descending=True)[:min(dimension, x_flat.shape[1])]]


def embed(x: torch.Tensor, embedding: torch.Tensor) -> torch.Tensor:
    """(rows × d) float64 embedded inputs, converted chunk by chunk."""
    flat = x.reshape(len(x), -1)
    return torch.cat([flat[i:i + ROWS_AT_ONCE].double() @ embedding for i in range(0, len(flat), ROWS_AT_ONCE)]) \
        if len(flat) else flat.new_zeros((0, embedding.shape[1]), dtype=torch.float64)


def gaussian_log_density(z: torch.Tensor, mean: torch.Tensor, cov: torch.Tensor) -> torch.Tensor:
    """log N(z_n; μ_m, Σ_m), (components × rows), from (rows × d) points and (components × d),
    (components × d × d) parameters (full covariances, through their Cholesky factors)."""
    chol = torch.linalg.cholesky(cov)
    diff = (z[None, :, :] - mean[:, None, :]).transpose(1, 2)  # (M × d × rows)
    solved = torch.linalg.solve_triangular(chol, diff, upper=False)
    mahalanobis = (solved ** 2).sum(dim=1)
    log_det = 2 * torch.log(torch.diagonal(chol, dim1=-2, dim2=-1)).sum(dim=-1)
    return -0.5 * (mahalanobis + log_det[:, None] + z.shape[1] * math.log(2 * math.pi))


def joint_responsibilities(log_pi: np.ndarray, log_density: np.ndarray, losses: np.ndarray) -> np.ndarray:
    """r (M1 × M2 × rows): softmax over the pairs (m1, m2) of log π[m1, m2] + log N_m1(z) − ℓ_m2."""
    scores = log_pi[:, :, None] + log_density[:, None, :] - losses[None, :, :]
    scores = scores - scores.max(axis=(0, 1), keepdims=True)
    r = np.exp(scores)
    return r / r.sum(axis=(0, 1), keepdims=True)


def input_weights(log_pi: torch.Tensor, log_density: torch.Tensor) -> torch.Tensor:
    """w (rows × M2): Σ_m1 of the posterior of (m1, m2) given z under π and the Gaussians (the
    prediction's weights), from (rows × M1 × M2) log π and (M1 × rows) log densities."""
    scores = log_pi + log_density.T[:, :, None]
    return torch.softmax(scores.flatten(1), dim=1).view_as(scores).sum(dim=1)


class FedGMM(Method):
    """FedGMM: M1 Gaussians over the inputs and M2 shared classifiers, a weight per client and pair (m1, m2), EM on the clients.

    Each sampled client receives the M2 classifiers, the Gaussians (μ, Σ) and the embedding,
    computes its responsibilities (`joint_responsibilities`) from its kept π_i, keeps their mean
    as its new π_i, sends its Gaussian statistics (mass Σ_n r_m1, mean and covariance of its
    embedded inputs under r_m1 = Σ_m2 r) and trains each classifier m2 for the round's local
    steps on the loss weighted by Σ_m1 r (`WeightedCrossEntropy`, as FedEM's M-step), sending the
    trained classifiers and their masses Σ_n Σ_m1 r. The server sets each Gaussian to the pooled
    moments of the clients' statistics weighted by their masses, plus `covariance_floor`·I, and
    each classifier to the mass-weighted average of the clients' (the authors' n_i·Σ π_i
    weights). A client is evaluated with its input-dependent mixture (`row_weights`). Its cluster
    (clusters.parquet, ARI/NMI) is the classifier it weights most, argmax_m2 Σ_m1 π_i[m1, m2]
    (our reading: the paper reports no clustering; the classifiers carry the concept a group
    shares, while inputs drawn alike in every group spread a client over the Gaussians, so the
    largest pair (m1, m2) split the groups of cluster-check at random, ARI 0.46 where the
    classifiers' gives 1.0); `mixture.parquet` holds the classifiers' weights and
    `gmm_pairs.parquet` every pair's, per evaluation.

    Readings and departures, with the authors' code:
    - The Gaussians live on a fixed embedding: the top `embedding` singular vectors of the
      clients' pooled training inputs, not centred, fitted once before training (the authors
      project frozen ImageNet ResNet-18 features with an uncentred PCA computed offline on all
      training data; no pretrained network is available here, so the raw inputs are projected).
      Like the authors' PCA it sees every client's inputs once, outside the federation.
    - The Gaussians start from one k-means of the pooled embedded inputs (scikit-learn, seeded),
      each with its members' covariance: the authors run a k-means on each client and average the
      clients' components by index, which pairs unrelated components.
    - The server pools moments exactly, Σ_m1 = Σ_i g_i(Σ_i + μ_iμ_iᵀ)/Σ_i g_i − μ_m1μ_m1ᵀ, where
      the authors average the clients' covariances (dropping the spread of their means); the
      floor 0.1·I is added once on the server (the authors add it on each client, and 0.1 to
      each component's count).
    - The prediction weights use log π_i (the authors' `predict_gmm` adds π_i without its log,
      unlike their E-step).
    - Only the round's sampled clients take part (the authors' clients all train every round);
      a client keeps its π_i between its rounds. The run's training block (steps, lr, momentum)
      applies to each classifier, on one batch stream per client.
    - The embedding travels with every payload (counted in bytes down each round: an upper
      bound; a deployment would send it once)."""

    checkpoint = ("models", "embedding", "means", "covs")

    @classmethod
    def check_hyperparams(cls, params):
        return {"clusters": 2, "gmm_components": 2, "embedding": 4}

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        hp, m1, m2 = ctx.hp, ctx.hp.gmm_components, ctx.hp.clusters
        self.models = random_models(ctx, m2, purpose=_MODELS)
        train = ctx.data.train
        flat = train.x.reshape(len(train.x), -1)
        self.embedding = uncentered_pca(flat, hp.embedding).to(flat.device)
        z = embed(flat, self.embedding).cpu().numpy()
        km = KMeans(n_clusters=min(m1, len(z)), n_init=10, random_state=seed32(ctx.seed, _KMEANS)).fit(z)
        dim = z.shape[1]
        means, covs = np.zeros((m1, dim)), np.tile(np.eye(dim), (m1, 1, 1))
        for k in range(len(km.cluster_centers_)):
            members = z[km.labels_ == k]
            means[k] = km.cluster_centers_[k]
            if len(members) > 1:
                covs[k] = np.cov(members, rowvar=False, bias=True).reshape(dim, dim)
        covs += hp.covariance_floor * np.eye(dim)
        self.means = torch.as_tensor(means, device=ctx.device)
        self.covs = torch.as_tensor(covs, device=ctx.device)
        ctx.clients.add("pi", torch.full((m1, m2), 1.0 / (m1 * m2), dtype=torch.float64, device=ctx.device))

    def payload(self, client: int) -> Payload:
        return Payload({"models": self.models, "embedding": self.embedding, "gmm_means": self.means,
                        "gmm_covs": self.covs})

    @classmethod
    def client_plan(cls, view: ClientView, payload: Payload) -> tuple[dict[str, ClientPlan], Any]:
        models = payload.tensors["models"]
        means, covs = payload.tensors["gmm_means"], payload.tensors["gmm_covs"]
        x, y = view.data()
        pi = view.kept("pi")
        m1, m2 = pi.shape
        flat = x.reshape(len(x), -1)
        if len(y):
            z, r = cls.e_step(view, payload)
            new_pi = torch.as_tensor(r.mean(axis=2), dtype=pi.dtype, device=pi.device)
            statistics = _gaussian_statistics(z, torch.as_tensor(r.sum(axis=1), dtype=z.dtype, device=z.device))
            weights = r.sum(axis=0)  # (M2 × rows)
        else:  # nothing to learn from: the weights stay and no statistics are sent
            dim = means.shape[1]
            new_pi, weights = pi, np.zeros((m2, 0))
            statistics = (torch.zeros(m1, dtype=means.dtype, device=means.device), torch.zeros_like(means),
                          torch.zeros(m1, dim, dim, dtype=covs.dtype, device=covs.device))
        inputs = torch.cat([flat, torch.as_tensor(weights.T, dtype=flat.dtype, device=flat.device)], dim=1)
        shape = tuple(x.shape[1:])
        plans = {f"model{j}": ClientPlan(models[j], inputs=inputs, loss=WeightedCrossEntropy.of(shape, m2, j))
                 for j in range(m2)}
        masses = torch.as_tensor(weights.sum(axis=1), dtype=torch.float64, device=pi.device)
        return plans, (new_pi, statistics, masses)

    @classmethod
    def e_step(cls, view: ClientView, payload: Payload) -> tuple[torch.Tensor, np.ndarray]:
        """The client's embedded inputs z and its joint responsibilities r (M1 × M2 × rows) from its
        kept π, the input components and the classifiers' losses on its training samples."""
        x, y = view.data()
        z = embed(x.reshape(len(x), -1), payload.tensors["embedding"])
        log_density = gaussian_log_density(z, payload.tensors["gmm_means"], payload.tensors["gmm_covs"])
        with np.errstate(divide="ignore"):  # a pair the client's EM gave up on: log 0 = −inf, weight 0
            log_pi = np.log(view.kept("pi").cpu().numpy())
        losses = sample_losses(view.apply, payload.tensors["models"], x, y)
        return z, joint_responsibilities(log_pi, log_density.cpu().numpy(), losses)

    newcomer_rule = ("receives the classifiers and the input components, computes its joint responsibilities on its "
                     "training samples from the π it kept at the last evaluation (uniform at the first; one E-step, as "
                     "in a round) and keeps their mean as its π: served that mixture (per input, as every client), in "
                     "the cluster of its largest share")
    newcomer_keeps = ("pi",)  # as FedEM's (its authors' unseen-client loop carries π too)

    def place(self, newcomers: Context) -> Placement:
        shares = asked_weights(self, newcomers).sum(axis=1)
        return Placement(lowest(-shares), Mixture(list(self.models), shares, self.row_weights_of(newcomers)))

    @classmethod
    def query(cls, view: ClientView, payload: Payload, trained: Any, scratch: Any) -> Update:
        if payload.meta.get("question") != "weights":
            return super().query(view, payload, trained, scratch)
        if not len(view.data()[1]):
            return view.answer({})
        pi = view.kept("pi")
        _, r = cls.e_step(view, payload)
        return view.answer({}, keep={"pi": torch.as_tensor(r.mean(axis=2), dtype=pi.dtype, device=pi.device)})

    @classmethod
    def client_finish(cls, view: ClientView, payload: Payload, trained: dict[str, Trained], scratch: Any) -> Update:
        new_pi, (mass, mean, cov), learner_mass = scratch
        runs = [trained[f"model{k}"] for k in range(len(trained))]
        record = next((t for t in runs if t.diverged), runs[0])
        tensors = {f"model{k}": t.vector for k, t in enumerate(runs)}
        tensors.update(gmm_mass=mass, gmm_mean=mean, gmm_cov=cov, learner_mass=learner_mass)
        return view.update(tensors, record, keep={"pi": new_pi})

    def aggregate(self, updates: dict[int, Update]) -> None:
        if not updates:
            return
        clients = list(updates)
        learner_mass = torch.stack([updates[c].tensors["learner_mass"] for c in clients])  # (clients × M2)
        for k in range(self.hp.clusters):
            if float(learner_mass[:, k].sum()) > 0:
                _, vectors, _ = stack_updates(updates, f"model{k}")
                self.models[k] = weighted_average(vectors, learner_mass[:, k].to(vectors.dtype))
        mass = torch.stack([updates[c].tensors["gmm_mass"] for c in clients])  # (clients × M1)
        mean = torch.stack([updates[c].tensors["gmm_mean"] for c in clients])  # (clients × M1 × d)
        cov = torch.stack([updates[c].tensors["gmm_cov"] for c in clients])  # (clients × M1 × d × d)
        total = mass.sum(dim=0)
        floor = self.hp.covariance_floor * torch.eye(self.means.shape[1], dtype=self.covs.dtype, device=self.covs.device)
        for m in range(self.means.shape[0]):
            if float(total[m]) <= 0:
                continue  # no sampled client holds this component: it stays
            share = mass[:, m] / total[m]
            pooled_mean = (share[:, None] * mean[:, m]).sum(dim=0)
            second = (share[:, None, None] * (cov[:, m] + mean[:, m, :, None] * mean[:, m, None, :])).sum(dim=0)
            self.means[m] = pooled_mean
            self.covs[m] = second - torch.outer(pooled_mean, pooled_mean) + floor

    # ------------------------------------------------------------------ evaluation

    def pi(self) -> np.ndarray:
        return self.ctx.clients["pi"].cpu().numpy()  # (clients × M1 × M2)

    def predictor(self, clients: np.ndarray | None = None) -> Mixture:
        return Mixture(list(self.models), self.shares(), self.row_weights)

    def shares(self) -> np.ndarray:
        """Each client's weight of each classifier (its input components' summed)."""
        return self.pi().sum(axis=1)

    def row_weights(self, x: torch.Tensor, clients: np.ndarray) -> torch.Tensor:
        """(rows × classifiers) weights of each input row of the given clients: the posterior of
        its client's input components."""
        return self.row_weights_of(self.ctx)(x, clients)

    def row_weights_of(self, owners: Context):
        """row_weights over the π kept by `owners`' clients (the participants', or new clients')."""
        return lambda x, clients: self._row_weights(owners.clients["pi"], x, clients)

    def _row_weights(self, pi: torch.Tensor, x: torch.Tensor, clients: np.ndarray) -> torch.Tensor:
        rows = torch.as_tensor(clients, device=pi.device)
        return torch.cat([input_weights(torch.log(pi[rows[i:i + ROWS_AT_ONCE]]),
                                        gaussian_log_density(embed(x[i:i + ROWS_AT_ONCE], self.embedding),
                                                             self.means, self.covs))
                          for i in range(0, len(x), ROWS_AT_ONCE)]) if len(x) else \
            torch.zeros((0, self.hp.clusters), dtype=torch.float64, device=pi.device)

    def assignment(self) -> np.ndarray:
        return lowest(-self.shares())

    def eval_tables(self) -> dict[str, dict[str, np.ndarray]]:
        """Each client's weight of each classifier (`mixture`, the shares its cluster is the
        largest of) and of each pair (m1, m2) (`gmm_pairs`)."""
        pi = self.pi()
        m, m1, m2 = pi.shape
        pairs = {"client": np.repeat(np.arange(m), m1 * m2), "component": np.tile(np.repeat(np.arange(m1), m2), m),
                 "classifier": np.tile(np.arange(m2), m * m1), "weight": pi.reshape(-1)}
        return {"mixture": mixture_table(self.shares()), "gmm_pairs": pairs}


def _gaussian_statistics(z: torch.Tensor, resp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A client's (mass, mean, covariance) of each component from its embedded inputs z (rows ×
    d) and responsibilities (M1 × rows): Σ_n r, the r-weighted mean and covariance (zero where
    the mass is zero)."""
    mass = resp.sum(dim=1)
    safe = mass.clamp_min(torch.finfo(mass.dtype).tiny)
    mean = (resp @ z) / safe[:, None]
    centred = z[None, :, :] - mean[:, None, :]  # (M1 × rows × d)
    cov = torch.einsum("mn,mnd,mne->mde", resp, centred, centred) / safe[:, None, None]
    return mass, mean, cov
