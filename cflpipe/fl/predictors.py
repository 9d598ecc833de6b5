"""What a method's clients predict with at an evaluation round: the one thing a method returns to
be evaluated (`Method.predictor`), in one of three shapes, each scored by its own function in
fl/evaluation.py:

    Models    client c predicts with models[index[c]] (one global model, a model per cluster,
              a personal model per client)
    Selected  the model applied to a set of inputs is chosen from the inputs (MCFL)
    Mixture   client c predicts with Σ_k weights[c, k]·softmax(models[k](x)) (FedEM), the weights
              per input where they depend on it (FedGMM)

Every shape holds `models` and `index` (each client's model: the one it predicts with, its
cluster's, or its largest share), which is what the conformance checks compare."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch


@dataclass
class Models:
    """Each client predicts with one of `models`: client c with models[index[c]] (an entry for
    every client; a sampled evaluation reads its clients' entries)."""

    models: list[torch.Tensor]
    index: np.ndarray

    @classmethod
    def shared(cls, model: torch.Tensor, clients: int) -> "Models":
        """One model for every client."""
        return cls([model], np.zeros(clients, dtype=np.int64))

    @classmethod
    def own(cls, models: torch.Tensor | list[torch.Tensor]) -> "Models":
        """A model per client, row c client c's."""
        return cls(list(models), np.arange(len(models)))

    @classmethod
    def own_of(cls, models: torch.Tensor, clients: np.ndarray | None, num_clients: int) -> "Models":
        """A model per client, built for `clients` alone (a sampled evaluation's sorted ids; None:
        every client, as `own`): row j is client clients[j]'s. As with `own`, client c's model is
        models[c] (a client's `model` is its own id); the others' are None, never read."""
        if clients is None:
            return cls.own(models)
        every: list = [None] * num_clients
        for c, row in zip(clients.tolist(), models):
            every[c] = row
        return cls(every, np.arange(num_clients))


@dataclass
class Selected:
    """The model applied to a set of inputs is the one `select(x)` picks for them (an index into
    `models`): each client's test set, and each true group's pooled test set, is evaluated with
    the model chosen for it. `index` is each client's cluster, which it trained (not read by the
    evaluation)."""

    models: list[torch.Tensor]
    index: np.ndarray
    select: Callable[[torch.Tensor], int]


@dataclass
class Mixture:
    """Client c predicts with Σ_k weights[c, k]·softmax(models[k](x)), rows of `weights` summing
    to 1, and is scored by that mixture's negative log-likelihood. `rows(x, clients)`, where given,
    gives (rows × models) weights per input row, `clients` the client of each row (FedGMM's
    posterior of its input components). A client's `model` column is its largest weight."""

    models: list[torch.Tensor]
    weights: np.ndarray
    rows: Callable[[torch.Tensor, np.ndarray], torch.Tensor] | None = None

    @property
    def index(self) -> np.ndarray:
        return np.argmax(self.weights, axis=1).astype(np.int64)


Predictor = Models | Selected | Mixture


def with_heads(shared: torch.Tensor, head_mask: torch.Tensor, heads: torch.Tensor,
               only: np.ndarray | None = None) -> torch.Tensor:
    """A shared model with each client's own head (rows of `heads` in the `head_mask` columns;
    FedPer's and FCCA+Per's client models), for the clients in `only` (sorted ids) where given."""
    if only is not None:
        heads = heads[torch.from_numpy(only).to(heads.device)]
    models = shared.repeat(len(heads), 1)
    models[:, head_mask] = heads
    return models
