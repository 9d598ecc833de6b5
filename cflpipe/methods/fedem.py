"""FedEM (Marfoq, Neglia, Bellet, Kameni and Vidal 2021, "Federated multi-task learning under a
mixture of distributions", NeurIPS 2021; authors' code github.com/omarfoq/FedEM).

Every client's data distribution is a mixture of K shared components: the federation trains K
models (one per component, shared by all clients) and every client its mixture weights π_i. Each
round a sampled client runs one EM step on its data: the E-step gives each of its samples a
responsibility q_k(j) ∝ π_ik·exp(−ℓ(model_k; x_j, y_j)), the M-step sets π_ik to the mean of q_k
and trains every model k on the loss weighted by q_k; the server averages each model over the
sampled clients. A client predicts with its mixture Σ_k π_ik·p_k(y | x).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from cflpipe.fl.method import ClientView, Context, Method, Payload, Placement, Update, stack_updates
from cflpipe.fl.params import weighted_average
from cflpipe.fl.plan import ClientPlan, Trained
from cflpipe.fl.predictors import Mixture
from cflpipe.methods.clustered import lowest, mixture_table
from cflpipe.methods.ifca import random_models, sample_losses


class WeightedCrossEntropy:
    """The M-step's loss of component k: (1/B)·Σ_j q_k(j)·ℓ(x_j, y_j) over a batch of B samples.
    A client's plans share one input tensor, its flattened inputs followed by one weight column per
    component (so that the trainer's batches carry the weights and the inputs are held once, not
    K times); `shape` is the model's input shape. One instance per (shape, components, k), so the
    plans of component k of all clients share it and the batched trainer trains them together."""

    _instances: dict[tuple, "WeightedCrossEntropy"] = {}

    def __init__(self, shape: tuple[int, ...], components: int, k: int):
        self.shape, self.components, self.k = shape, components, k

    @classmethod
    def of(cls, shape: tuple[int, ...], components: int, k: int) -> "WeightedCrossEntropy":
        key = (tuple(shape), components, k)
        return cls._instances.setdefault(key, cls(*key))

    def __call__(self, forward, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        features = x.shape[1] - self.components
        weights = x[:, features + self.k]
        logits = forward(x[:, :features].reshape(x.shape[0], *self.shape))
        return (weights * F.cross_entropy(logits, y, reduction="none")).mean()


def responsibilities(log_pi: np.ndarray, losses: np.ndarray) -> np.ndarray:
    """q (K × samples): softmax over k of log π_k − ℓ_k(j) (the E-step)."""
    scores = log_pi[:, None] - losses
    scores = scores - scores.max(axis=0, keepdims=True)
    q = np.exp(scores)
    return q / q.sum(axis=0, keepdims=True)


def asked_weights(method: Method, newcomers: Context) -> np.ndarray:
    """A mixture method's placement of new clients (FedEM, FedRC, FedGMM): each receives what a
    participant receives (`method.payload`), answers the question "weights" by its method's
    `query` (one E-step of its mixture weights from the π it kept at the last placement, uniform
    at the first, on its training data) and keeps its π; the new clients' kept π, (new clients × …)."""
    payload = method.payload(0)
    payload.meta["question"] = "weights"
    newcomers.ask({c: payload for c in range(newcomers.num_clients)})
    return newcomers.clients["pi"].cpu().numpy()


class FedEM(Method):
    """FedEM: K shared component models, a mixture weight per client and component, EM on the clients.

    Each sampled client receives the K models, computes every model's loss on each of its
    training samples, its responsibilities q (`responsibilities`, from its kept π_i) and its new
    π_i = mean of q (kept on the client), then trains each model k for the round's local steps
    on the q_k-weighted loss (`WeightedCrossEntropy`) and sends the K trained models. The server
    sets each model to the sample-weighted average of the clients' (the authors' aggregator
    weights clients by their sample counts). A client is evaluated with its mixture of the K
    models (a `Mixture` predictor); its cluster, for clusters.parquet and the ARI/NMI, is its largest
    weight argmax_k π_ik, and every evaluation writes the π_i to `mixture.parquet`.

    As in the authors' code: the K models start from independent random initializations, π_i
    from the uniform 1/K, and a client not sampled keeps its π_i. Where we differ: the
    authors' clients train with their own optimizer and epochs per learner; here the run's
    training block (steps, lr, momentum) applies to each of the K models, on one batch stream
    per client (the K models see the same batches, as the authors' one data loader)."""

    checkpoint = ("models",)

    @classmethod
    def check_hyperparams(cls, params):
        return {"clusters": 2}

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        k = ctx.hp.clusters
        self.models = random_models(ctx, k, purpose=0xFE3)
        ctx.clients.add("pi", torch.full((k,), 1.0 / k, dtype=torch.float64, device=ctx.device))

    def payload(self, client: int) -> Payload:
        return Payload({"models": self.models})

    @classmethod
    def client_plan(cls, view: ClientView, payload: Payload) -> tuple[dict[str, ClientPlan], Any]:
        models = payload.tensors["models"]
        x, y = view.data()
        pi = view.kept("pi")
        labels = y.cpu().numpy()
        if len(y):
            q = cls.responsibilities_of(payload, pi.cpu().numpy(), sample_losses(view.apply, models, x, y), labels)
            new_pi = torch.as_tensor(q.mean(axis=1), dtype=pi.dtype, device=pi.device)
        else:  # nothing to learn from: the weights stay
            q, new_pi = np.zeros((len(models), 0)), pi
        flat = x.reshape(len(x), -1)
        inputs = torch.cat([flat, torch.as_tensor(q.T, dtype=flat.dtype, device=flat.device)], dim=1)
        shape, k = tuple(x.shape[1:]), len(models)
        plans = {f"model{j}": ClientPlan(models[j], inputs=inputs, loss=WeightedCrossEntropy.of(shape, k, j))
                 for j in range(k)}
        return plans, cls.client_scratch(view, new_pi, q, labels)

    @classmethod
    def responsibilities_of(cls, payload: Payload, pi: np.ndarray, losses: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """The E-step on a client's samples (K × samples)."""
        return responsibilities(np.log(pi), losses)

    @classmethod
    def client_scratch(cls, view: ClientView, new_pi: torch.Tensor, q: np.ndarray, labels: np.ndarray) -> Any:
        """What client_finish needs of the E-step: the new mixture weights."""
        return new_pi

    @classmethod
    def client_finish(cls, view: ClientView, payload: Payload, trained: dict[str, Trained],
                      new_pi: torch.Tensor) -> Update:
        runs = [trained[f"model{k}"] for k in range(len(trained))]
        record = next((t for t in runs if t.diverged), runs[0])
        return view.update({f"model{k}": t.vector for k, t in enumerate(runs)}, record, keep={"pi": new_pi})

    def aggregate(self, updates: dict[int, Update]) -> None:
        if not updates:
            return
        for k in range(self.hp.clusters):
            _, vectors, weights = stack_updates(updates, f"model{k}")
            self.models[k] = weighted_average(vectors, weights)

    # ------------------------------------------------------------------ evaluation

    def predictor(self, clients: np.ndarray | None = None) -> Mixture:
        return Mixture(list(self.models), self.mixture())

    def mixture(self) -> np.ndarray:
        return self.ctx.clients["pi"].cpu().numpy()

    def assignment(self) -> np.ndarray:
        return lowest(-self.mixture())

    def eval_tables(self) -> dict[str, dict[str, np.ndarray]]:
        """Each client's mixture weights π_i, long format: client, cluster, weight."""
        return {"mixture": mixture_table(self.mixture())}

    newcomer_rule = ("receives the K component models (FedRC: and the clusters' label distributions), computes its "
                     "responsibilities on its training samples from the π it kept at the last evaluation (uniform at "
                     "the first; one E-step, as in a round) and keeps their mean as its π: served that mixture, in the "
                     "cluster of its largest weight")
    # One E-step and one π update per evaluation from the last π, as the authors' code updates its
    # unseen clients (docs/new-clients.md, "FedEM, FedRC and FedGMM: which fit of a new client's weights").
    newcomer_keeps = ("pi",)

    def place(self, newcomers: Context) -> Placement:
        weights = asked_weights(self, newcomers)
        return Placement(lowest(-weights), Mixture(list(self.models), weights))

    @classmethod
    def query(cls, view: ClientView, payload: Payload, trained: Any, scratch: Any) -> Update:
        if payload.meta.get("question") != "weights":
            return super().query(view, payload, trained, scratch)
        x, y = view.data()
        pi = view.kept("pi")
        if not len(y):
            return view.answer({})
        new_pi = cls.new_client_weights(payload, pi.cpu().numpy(), sample_losses(view.apply, payload.tensors["models"], x, y),
                                        y.cpu().numpy())
        return view.answer({}, keep={"pi": torch.as_tensor(new_pi, dtype=pi.dtype, device=pi.device)})

    @classmethod
    def new_client_weights(cls, payload: Payload, pi: np.ndarray, losses: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """A placement's update of a new client's π: one E-step from its kept π and their mean."""
        return cls.responsibilities_of(payload, pi, losses, labels).mean(axis=1)


# ---------------------------------------------------------------------------- FedRC


def label_counts(q: np.ndarray, y: np.ndarray, classes: int) -> np.ndarray:
    """(K × classes): Σ_j q_k(j)·1[y_j = c], a client's soft count of each label in each cluster."""
    counts = np.zeros((q.shape[0], classes))
    for k in range(q.shape[0]):
        counts[k] = np.bincount(y, weights=q[k], minlength=classes)
    return counts


def label_prior(counts: np.ndarray) -> np.ndarray:
    """P_k(y) from the clients' summed counts (K × classes), each entry at least 1e-8 before the
    rows are normalized (the authors' floor)."""
    floored = np.maximum(counts, 1e-8)
    return floored / floored.sum(axis=1, keepdims=True)


class FedRC(FedEM):
    """FedRC (Guo, Tang and Lin 2024): FedEM whose E-step divides by each cluster's label distribution, to cluster by concept shift.

    Guo, Tang and Lin 2024, "FedRC: Tackling diverse distribution shifts challenge in federated
    learning by robust clustering", ICML 2024; authors' code github.com/LINs-lab/FedRC (client
    `FedRC`, run_experiment.py). As FedEM, except the responsibilities: q_k(j) ∝
    π_ik·exp(−ℓ_k(x_j, y_j)) / P_k(y_j), where P_k is cluster k's label distribution. A client
    sends, beside its K models, its soft label counts Σ_j q_k(j)·1[y_j = c] (K × classes); after
    each round the server sums the last counts of every client, floors them at 1e-8, normalizes
    each cluster's row into P_k and sends it down with the models. P_k starts uniform (the
    authors' initial label weights are the same for every label, which the softmax ignores). A
    label that is frequent in a cluster then no longer draws samples to it: clusters form by
    P(y | x), not by P(y). Evaluation, the mixture table and the rest are FedEM's."""

    checkpoint = ("models", "counts", "prior")
    # FedEM's rule for new clients, with FedRC's E-step (responsibilities_of) and its prior sent
    place, newcomer_rule = FedEM.place, FedEM.newcomer_rule

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        k, classes = ctx.hp.clusters, ctx.data.num_classes
        self.counts = np.zeros((ctx.num_clients, k, classes))
        self.prior = np.full((k, classes), 1.0 / classes)

    def payload(self, client: int) -> Payload:
        return Payload({"models": self.models,
                        "prior": torch.as_tensor(self.prior, dtype=torch.float64, device=self.models.device)})

    @classmethod
    def responsibilities_of(cls, payload: Payload, pi: np.ndarray, losses: np.ndarray, labels: np.ndarray) -> np.ndarray:
        prior = payload.tensors["prior"].cpu().numpy()
        return responsibilities(np.log(pi), losses + np.log(prior[:, labels]))

    @classmethod
    def client_scratch(cls, view: ClientView, new_pi: torch.Tensor, q: np.ndarray, labels: np.ndarray) -> Any:
        counts = label_counts(q, labels, view.classes)
        return new_pi, torch.as_tensor(counts, dtype=torch.float64, device=new_pi.device)

    @classmethod
    def client_finish(cls, view: ClientView, payload: Payload, trained: dict[str, Trained], scratch: Any) -> Update:
        new_pi, counts = scratch
        update = super().client_finish(view, payload, trained, new_pi)
        update.tensors["label_counts"] = counts
        return update

    def aggregate(self, updates: dict[int, Update]) -> None:
        super().aggregate(updates)
        for client, update in updates.items():
            self.counts[client] = update.tensors["label_counts"].cpu().numpy()
        self.prior = label_prior(self.counts.sum(axis=0))
