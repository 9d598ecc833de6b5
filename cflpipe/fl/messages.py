"""The messages of the method contract (fl/method.py): what the server sends a client (`Payload`),
what a client sends back (`Update`), where a method places new clients (`Placement`), and what a
client's step may see (`ClientView`); the helpers that read a round's updates."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
import torch

from cflpipe.fl.data import FederatedData
from cflpipe.fl.local import LocalResult
from cflpipe.fl.params import ParamSpace
from cflpipe.fl.plan import Trained
from cflpipe.fl.predictors import Predictor
from cflpipe.metrics import tensor_bytes
from cflpipe.seeds import mix_seed, rng
from cflpipe.spec import Training

@dataclass
class Payload:
    """What the server sends one client this round; its tensors are counted as bytes down, but
    those named in `held`: what the client already holds this round (its round payload, an earlier
    question's), sent again only for the client side's convenience (Context.ask)."""

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    held: tuple[str, ...] = ()

    @property
    def nbytes(self) -> int:
        return tensor_bytes(*(tensor for name, tensor in self.tensors.items() if name not in self.held))


@dataclass
class Update:
    """What one client sends back; its tensors are counted as bytes up. `keep` is what the
    client keeps for later rounds (a personal model, a head): never sent, stored in the
    engine's client store when the update is accepted (not when its training diverged)."""

    tensors: dict[str, torch.Tensor]
    n: int  # training samples of the client (aggregation weight)
    result: LocalResult
    meta: dict[str, Any] = field(default_factory=dict)
    keep: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return tensor_bytes(*self.tensors.values())


@dataclass
class Placement:
    """Where a method places the clients that never trained (scenario `new_clients`) and what
    serves them: `clusters[c]` new client c's cluster (−1: none), `predictor` what it predicts
    with (fl/predictors.py, indexed by new client)."""

    clusters: np.ndarray
    predictor: Predictor


# What an answer that trained nothing reports as its training (Context.ask).
NOT_TRAINED = LocalResult(0.0, 0, 0)
# The question that sends a new client what serves it (Method.served): it answers nothing.
SERVE = "serve"
# The question "do what a sampled client does in a round" (Method.query_plan, Method.query).
ROUND = "round"


@dataclass(frozen=True)
class ClientView:
    """What one client's step may use, and nothing else (Flower's ClientApp gets a message and its
    own Context.state): its own data, its own rows of the client store, the run's model
    application, its seeded randomness, its hyper-parameters and the training settings. A method
    whose client side is written over a view (`Method.client_plan`/`client_finish`, static) can
    read no server state and no other client's; it returns its scratch instead of writing it
    anywhere."""

    client: int
    round: int
    hp: Any
    training: Training
    samples: int  # its training samples (its update's weight)
    # The model's parameter layout (the masks of its layers: body, head, first layers; its working
    # vector is the trainer's, not the client's) and each network's initial vector, which every
    # client starts from (shared with the server: copy before changing one in place).
    space: ParamSpace
    initial: "Mapping[str, torch.Tensor]"
    _data: FederatedData
    _store: Any  # the run's ClientStore (fl/context.py, which imports this module)
    _apply: Any
    _seed: int

    def data(self, split: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
        """The client's own training inputs and targets. Its test and validation splits are the
        evaluation's: training, answers and the placement of new clients never read them (a
        method that did would be tuned or placed on what it is scored on), so asking is an error."""
        if split != "train":
            raise ValueError(f"ClientView.data({split!r}): a client's plans, answers and placement read its "
                             f"training split only; the {split} split is for evaluation")
        return self._data.client(self.client, split)

    @property
    def classes(self) -> int:
        """The number of labels of the run's data set."""
        return int(self._data.num_classes)

    def kept(self, name: str) -> torch.Tensor:
        """A copy of what the client keeps under `name` (its row of the client store)."""
        return self._store.get(name, self.client).clone()

    def apply(self, vectors: torch.Tensor, *inputs: torch.Tensor, **options: Any) -> torch.Tensor:
        """Context.apply: parameter vectors applied to inputs by the run's trainer."""
        return self._apply(vectors, *inputs, **options)

    def rng(self, *purpose: int) -> np.random.Generator:
        """Client-side randomness of this round, seeded by (run seed, round, client, purpose): the
        stream Context.rng(client, *purpose) gives."""
        return rng(self._seed, self.round, self.client, *purpose, 0x5E)

    def lr(self) -> float:
        """This round's learning rate (training.lr decayed by lr_decay per round), as Context.lr."""
        return round_lr(self.training, self.round)

    def torch_generator(self, *purpose: int) -> torch.Generator:
        """A CPU torch generator seeded by (run seed, round, client, purpose)."""
        return torch.Generator().manual_seed(mix_seed(self._seed, self.round, self.client, *purpose))

    def update(self, tensors: dict[str, torch.Tensor], trained: Trained,
               keep: dict[str, torch.Tensor] | None = None, **meta: Any) -> Update:
        """The client's Update, weighted by its training samples, with the loss record of `trained`;
        `keep` is what the client keeps (stored, never sent), `meta` what the server reads beside
        the tensors (not counted as bytes: small scalars such as a loss)."""
        # A diverged follow-up (FCCA's cINN) makes the whole update a diverged one.
        result = trained.then.result if trained.then is not None and trained.then.diverged else trained.result
        return Update(tensors, self.samples, result, meta=meta, keep=keep or {})

    def answer(self, tensors: dict[str, torch.Tensor], keep: dict[str, torch.Tensor] | None = None,
               **meta: Any) -> Update:
        """The client's answer to a question that trained nothing (Method.query), as `update`."""
        return Update(tensors, self.samples, NOT_TRAINED, meta=meta, keep=keep or {})


def round_lr(training: Training, round_index: int) -> float:
    """The learning rate of a round: training.lr decayed by lr_decay once per round."""
    return training.lr * training.lr_decay ** round_index


def stack_updates(updates: dict[int, Update], key: str = "model") -> tuple[np.ndarray, torch.Tensor, torch.Tensor]:
    """Clients, their uploaded vectors as one (clients × parameters) matrix, and their weights.
    Each update's `key` tensor is replaced by its row of the matrix (same values)."""
    clients = np.fromiter(updates, dtype=np.int64)
    if len(clients) == 0:
        raise ValueError("stack_updates: no updates")
    first = updates[int(clients[0])].tensors[key]
    vectors = torch.empty((len(clients), *first.shape), dtype=first.dtype, device=first.device)
    for row, client in enumerate(clients):
        tensor = updates[client].tensors[key]
        if tensor.shape != first.shape or tensor.dtype != first.dtype:  # torch.stack's check
            raise ValueError(f"stack_updates: client {client}'s {key!r} is {tuple(tensor.shape)} {tensor.dtype}, "
                             f"client {clients[0]}'s {tuple(first.shape)} {first.dtype}")
        vectors[row] = tensor
        # The update reads its row from now on, so the client's own copy is freed as the matrix
        # fills: a round holds its uploads once, not twice (at 2,000 clients × 221 KB, 442 MB).
        # With the batched trainer the uploads are rows of one matrix per group, freed with the
        # group's last row.
        updates[client].tensors[key] = vectors[row]
    weights = torch.tensor([updates[c].n for c in clients], dtype=vectors.dtype, device=vectors.device)
    return clients, vectors, weights


def take_rows(vectors: dict[int, torch.Tensor]) -> tuple[np.ndarray, torch.Tensor]:
    """The clients (sorted) and their vectors as one matrix, each vector moved out of the dict as
    its row is written: a clustering round that heard from every client (FL+HC's, FeSEM's first)
    holds their models once, not twice (2 GiB at 10,000 clients of the mlp, #59)."""
    clients = np.array(sorted(vectors), dtype=np.int64)
    first = vectors[int(clients[0])]
    matrix = torch.empty((len(clients), *first.shape), dtype=first.dtype, device=first.device)
    for row, client in enumerate(clients):
        matrix[row] = vectors.pop(int(client))
    return clients, matrix


class WeightedSum:
    """Σ n_i v_i and Σ n_i over vectors added one at a time, the sum in float64.

    In float64 the order of the additions hardly shows (a float32 vector times an integer
    weight is exact there; each addition rounds at 2⁻⁵³): the mean equals a stacked float32
    mean to float32 rounding, and the same additions in the same order give the same bits, so
    a run is bit-identical with itself whether its uploads were held or summed as they came."""

    def __init__(self) -> None:
        self.total: torch.Tensor | None = None
        self.weight = 0
        self.dtype: torch.dtype | None = None

    def add(self, vector: torch.Tensor, weight: int) -> None:
        if self.total is None:
            self.total = torch.zeros(vector.shape, dtype=torch.float64, device=vector.device)
            self.dtype = vector.dtype
        elif vector.shape != self.total.shape or vector.dtype != self.dtype:
            raise ValueError(f"WeightedSum: a {tuple(vector.shape)} {vector.dtype} vector added to a sum of "
                             f"{tuple(self.total.shape)} {self.dtype} vectors")
        self.total.add_(vector, alpha=weight)
        self.weight += weight

    def mean(self) -> torch.Tensor:
        if self.total is None:
            raise ValueError("WeightedSum: nothing was added")
        return (self.total / self.weight).to(self.dtype)


def average_updates(updates: dict[int, Update], key: str = "model") -> torch.Tensor:
    """The sample-weighted mean of the updates' `key` vectors, summed in the updates' order (a
    WeightedSum): the same bits as the engine's running sums of a method with streamed_means."""
    if not updates:
        raise ValueError("average_updates: no updates")
    total = WeightedSum()
    for update in updates.values():
        total.add(update.tensors[key], update.n)
    return total.mean()
