"""New clients (scenario `new_clients`): a seeded share of the clients held out of training, never
sampled and never seen by the server, placed at every full evaluation by each method's own rule
(`Method.place`) and evaluated with what it serves them.

The engine splits the scenario's data into the participants (what the method and every other
part of a run see, numbered 0..m-1 in the scenario's order) and the new clients (a sibling
context over their data, `Context.sibling`). What the placement asks of them and what they send is
counted as new_bytes_down / new_bytes_up, apart from the training's traffic; the placement
changes no state of the method, so a run with new clients trains the same bytes as one without
them over the same participants (a conformance check). Its time is part of the round's
eval_seconds."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from cflpipe.fl.axes import Axis
from cflpipe.fl.axes.placement import with_their_group
from cflpipe.fl.data import FederatedData
from cflpipe.fl.evaluation import evaluate
from cflpipe.fl.method import Context, Method, Placement
from cflpipe.fl.predictors import Predictor
from cflpipe.seeds import mix_seed, rng

# Purposes of the new clients' draws (their choice, their own randomness).
_CHOICE, _THEIR_SEED = 0x4E43, 0x4E53
# What a round reports of them (rounds.parquet, summary.json's final figures).
FIGURES = ("new_acc_macro", "new_acc_worst10", "new_ari", "new_nmi", "new_placed", "new_joined", "new_bytes_down",
           "new_bytes_up")


def choose(data: FederatedData, count: int, seed: int) -> np.ndarray:
    """The new clients (sorted ids): a seeded choice, by the run's seed, of `count` clients with
    training samples (a new client adapts on its own training split)."""
    candidates = np.flatnonzero(data.train.sizes() > 0)
    return np.sort(rng(seed, _CHOICE).choice(candidates, size=min(count, len(candidates)), replace=False))


def placed_sample(count: int, share: float, seed: int) -> np.ndarray:
    """The new clients placed where full evaluations read a sample of the participants (their
    places among the new clients, sorted): a seeded choice, by the run's seed, of `share` of the
    `count` of them, at least one."""
    wanted = min(count, max(1, math.ceil(share * count)))
    return np.sort(rng(seed, _CHOICE, 1).permutation(count)[:wanted])


def split(data: FederatedData, newcomers: np.ndarray) -> tuple[FederatedData, FederatedData]:
    """(the participants' data, the new clients' data), each numbered from 0 in id order."""
    participants = np.setdiff1d(np.arange(data.num_clients), newcomers)
    return data.subset(participants), data.subset(newcomers)


def sibling(ctx: Context, data: FederatedData) -> Context:
    """The context the method asks its new clients through."""
    return ctx.sibling(data, mix_seed(ctx.seed, _THEIR_SEED))


def joined(method: Method, clusters: np.ndarray, groups: np.ndarray) -> float:
    """The share of the new clients placed in the cluster that holds most of the participants of
    their true group (new_ari compares the new clients' placements with each other only), among
    those placed in a cluster; NaN without true groups, for a method without clusters or whose
    participants are all in one, or where no placed new client has a clustered participant of its
    group."""
    held, theirs = method.assignment(), method.ctx.data.groups
    if held is None or not method.ctx.data.has_groups or not len(groups) or (groups < 0).any():
        return float("nan")
    hits = with_their_group(np.asarray(held), theirs, np.asarray(clusters), np.asarray(groups))
    return float(np.mean(hits[np.isfinite(hits)])) if np.isfinite(hits).any() else float("nan")


class _Served:
    """What evaluation reads of a method, for the new clients: the placement's predictor and
    clusters."""

    def __init__(self, placement: Placement):
        self.placement = placement

    def predictor(self, clients: np.ndarray | None = None) -> Predictor:
        return self.placement.predictor

    def assignment(self) -> np.ndarray:
        return self.placement.clusters

    def eval_tables(self) -> dict:
        return {}


def place(method: Method, newcomers: Context, round_index: int, round_number: int, eval_batch_size: int,
          ids: np.ndarray, kept: dict[str, Any]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The round's new-client figures and its rows of newcomers.parquet (round, client by its
    scenario id, cluster, true group, test accuracy and samples); NaN figures where the method has
    no rule (and no rows). `kept`: the tables the method's rule carries from the last placement
    (`Method.newcomer_keeps`), updated in place."""
    newcomers.round = round_index
    newcomers.extra_bytes_down = newcomers.extra_bytes_up = 0
    # Every placement starts from clients that keep nothing but what the method's rule carries
    # (checkpointed with the run: a resumed run places as an uninterrupted one does).
    newcomers.clients = method.ctx.clients.fresh(newcomers.num_clients)
    for name, table in kept.items():
        newcomers.clients[name] = table.clone()
    placement = method.place(newcomers)
    kept.update({name: newcomers.clients[name].clone() for name in method.newcomer_keeps})
    if placement is None:
        return {name: float("nan") for name in FIGURES}, {}
    data = newcomers.data
    clusters = np.asarray(placement.clusters, dtype=np.int64)
    result = evaluate(newcomers, _Served(placement), data, eval_batch_size, newcomers.seed, round_number,
                      train_split=False)
    f = result.figures
    figures = {"new_acc_macro": f["acc_macro"], "new_acc_worst10": f["acc_worst10"], "new_ari": f["ari"],
               "new_nmi": f["nmi"], "new_placed": float((clusters >= 0).mean()) if len(clusters) else float("nan"),
               "new_joined": joined(method, clusters, data.groups),
               "new_bytes_down": float(newcomers.extra_bytes_down), "new_bytes_up": float(newcomers.extra_bytes_up)}
    rows = result.tables["metrics"]
    test = rows["split"] == "test"
    table = {"round": np.full(len(clusters), round_number), "client": ids, "cluster": clusters,
             "true_group": data.groups, "acc": rows["acc"][test], "n": rows["n"][test]}
    return figures, table


class NewClients(Axis):
    """The scenario's `new_clients` share, held out at setup and placed at every full evaluation
    that reads test data."""

    name = "newcomers"

    def __init__(self, share: float):
        self.share = share

    def prepare(self, run) -> None:
        self.ids = choose(run.data, max(1, round(self.share * run.data.num_clients)), run.seed)
        run.data, self.data = split(run.data, self.ids)

    def attach(self, run) -> None:
        # Placing one trains it a round: all of them, or where full evaluations read a sample of
        # the participants, a seeded sample of them in the same share.
        self.placed = self.ids
        if run.population is not None:
            chosen = placed_sample(len(self.ids), run.population_size / run.data.num_clients, run.seed)
            self.placed, self.data = self.ids[chosen], self.data.subset(chosen)
        self.ctx = sibling(run.ctx, self.data)
        self.kept: dict[str, Any] = {}

    def evaluate(self, run, round_number, clients, result):
        # scored on their test splits: not in a run that reads none
        full = clients is None or clients is run.population
        if not (full and run.training.eval_test):
            return None
        return place(run.method, self.ctx, run.ctx.round, round_number, run.training.eval_batch_size, self.placed,
                     self.kept)

    def state(self) -> dict[str, Any]:
        return dict(self.kept)

    def load_state(self, state: dict[str, Any]) -> None:
        self.kept = {name: table.to(self.ctx.device) for name, table in state.items()}

    def summary(self, run) -> dict:
        # the participants are the others, numbered 0..clients-1 in id order
        return {"new_clients": [int(c) for c in self.ids]}
