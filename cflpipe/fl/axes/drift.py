"""Groups that change (scenario `drift`): from a given round on, a seeded share of the clients
belongs to another ground-truth group (the partition's moves, drift.parquet); the engine applies
each move before its round trains (`FederatedData.drift_to`), so every view of a client's rows
and the truth that ARI reads are the current ones, and a resumed run applies the moves of the
rounds it already trained before it plays on.

What a run reports of them: at every full evaluation the moved clients' and the others' mean
accuracy (moved_acc_macro: the clients of any move, before their move too, so the dip shows),
and drift_joined, the share of the clients moved so far that the method places in the cluster
holding most of the never-moved clients of their new group (NaN for a method without clusters
or with one); drift.parquet has each moved client's row at each full evaluation. The rounds
before and at each move are evaluated in full whatever eval_every says."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from cflpipe.fl.axes import Axis, plain
from cflpipe.fl.axes.placement import with_their_group
from cflpipe.fl.data import FederatedData

def evaluated_rounds(data: FederatedData) -> set[int]:
    """The 1-based rounds a drift scenario evaluates in full: the last before each move, and its
    first after."""
    return {r for move in data.moves for r in (move.round - 1, move.round) if r >= 1}


def movers(data: FederatedData) -> np.ndarray:
    """Every client that moves at some point (sorted)."""
    return np.unique([move.client for move in data.moves]).astype(np.int64)


def report(assignment: np.ndarray | None, data: FederatedData, metrics: dict[str, np.ndarray],
           round_number: int) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A full evaluation's drift figures and its rows of drift.parquet (every client that moves at
    some point: round, client, moved (its move applied), group, cluster, placed_with_group, acc),
    from the evaluation's metrics rows and the method's assignment."""
    every = movers(data)
    test = metrics["split"] == "test"
    acc = np.full(data.num_clients, np.nan)
    acc[metrics["client"][test]] = metrics["acc"][test]
    applied = np.unique([move.client for move in data.moves[:data.moved]]).astype(np.int64)
    others = np.setdiff1d(np.arange(data.num_clients), every)
    if assignment is None:  # no clusters: nothing to say
        joined = np.full(len(applied), np.nan)
    else:  # each moved client against the clients that never move (a mover's group matches none)
        held, anchors = np.asarray(assignment, dtype=np.int64), data.groups.copy()
        anchors[every] = -2
        joined = with_their_group(held, anchors, held[applied], data.groups[applied])
    figures = {"moved_acc_macro": _mean(acc[every]), "unmoved_acc_macro": _mean(acc[others]),
               "drift_joined": _mean(joined)}
    placed = np.full(len(every), np.nan)
    placed[np.searchsorted(every, applied)] = joined
    cluster = np.full(len(every), -1) if assignment is None else np.asarray(assignment, dtype=np.int64)[every]
    table = {"round": np.full(len(every), round_number), "client": every, "moved": np.isin(every, applied),
             "group": data.groups[every], "cluster": cluster, "placed_with_group": placed, "acc": acc[every]}
    return figures, table


def summary(data: FederatedData, table: pd.DataFrame) -> list[dict[str, Any]]:
    """Per drift event: its round and clients, their mean accuracy at the last full evaluation
    before it, the first at or after it and the last before each client's next move (the run's
    last without one): the dip and the recovery; the share placed with their new group then; and
    for each client the rounds trained after its move until it was first placed with it (null:
    never). A client that moves again is followed, for this event, until that next move."""
    out = []
    for round_number in sorted({move.round for move in data.moves}):
        clients = sorted({move.client for move in data.moves if move.round == round_number})
        before, after, final, placed, first_placed = [], [], [], [], []
        for client in clients:
            later = [m.round for m in data.moves if m.client == client and m.round > round_number]
            mine = table[(table["client"] == client) & (table["round"] < min(later, default=np.inf))]
            mine = mine.sort_values("round", kind="stable")
            earlier, since = mine[mine["round"] < round_number], mine[mine["round"] >= round_number]
            before.append(earlier["acc"].iloc[-1] if len(earlier) else np.nan)
            after.append(since["acc"].iloc[0] if len(since) else np.nan)
            final.append(mine["acc"].iloc[-1] if len(mine) else np.nan)
            placed.append(since["placed_with_group"].iloc[-1] if len(since) else np.nan)
            hit = since[since["placed_with_group"] == 1]
            first_placed.append(int(hit["round"].min()) - round_number + 1 if len(hit) else None)
        out.append({"round": round_number, "clients": clients,
                    "moved_acc_before": plain(_mean(np.array(before, dtype=float))),
                    "moved_acc_after": plain(_mean(np.array(after, dtype=float))),
                    "moved_acc_final": plain(_mean(np.array(final, dtype=float))),
                    "placed_with_group_final": plain(_mean(np.array(placed, dtype=float))),
                    "rounds_to_place": first_placed})
    return out


def _mean(values: np.ndarray) -> float:
    """The mean of the defined values (a client without test samples has no accuracy); NaN if none."""
    return float(np.mean(values[np.isfinite(values)])) if np.isfinite(values).any() else float("nan")


class Drift(Axis):
    """The partition's moves, applied before their rounds; the rounds around each evaluated over
    every client where test data is read."""

    name = "drift"

    def prepare(self, run) -> None:
        self.data = run.data
        self.eval_test = run.training.eval_test
        self.every_client_rounds = frozenset(evaluated_rounds(run.data)) if self.eval_test else frozenset()

    def at_round(self, round_number: int) -> None:
        self.data.drift_to(round_number)

    def evaluate(self, run, round_number, clients, result):
        if clients is not None or not self.eval_test:
            return None
        return report(run.method.assignment(), run.data, result.tables["metrics"], round_number)

    def summary(self, run) -> dict:
        if not self.eval_test:
            return {}
        return {"drift": summary(run.data, pd.DataFrame(dict(run.tables.get("drift", {}))))}
