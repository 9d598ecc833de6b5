"""Evaluation of a method's models at an evaluation round: each client's model on its own test
and training split (metrics.parquet), every distinct model on the pooled test data (global and
intra/inter-cluster accuracy), and the clustering against the true groups (clusters.parquet).
With `training.eval_clients`, evaluation rounds between full ones read a seeded sample of the
clients (and their pooled data) instead; the clustering is always every client's.

The models are applied through the run's trainer (`Context.apply`): one vector after the other,
or all of them at once with vmap where the trainer batches, so K cluster models or a personal
model per client cost one batched pass per chunk of rows rather than one pass per model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from cflpipe.fl.data import FederatedData, SplitData as Split
from cflpipe.fl.method import Context, Method
from cflpipe.fl.predictors import Mixture, Selected
from cflpipe.seeds import rng
from cflpipe.spec._models import evaluated_clients
from cflpipe.metrics import (clustering_scores, mixture_error, device_f1, f1_macro_over_classes, intra_inter_accuracy,
                             per_client_accuracy, per_client_f1, per_client_mean, personalized_summary)

# Global accuracy and intra/inter accuracy score every distinct model on all clients' pooled
# test data; with per-client models that is clients × pooled test, so a seeded sample of at most
# this many models is scored (recorded in rounds.parquet as `global_models`).
MAX_GLOBAL_MODELS = 100
# Rows of the pooled test data the scored models read together: beyond it each reads a seeded
# sample of the rows (the same for every model; rounds.parquet's `global_rows`). 100 per-client
# models on 10,000 clients' 166,000 pooled test rows were 16.6 M forward rows, 26 s of a final
# evaluation against 0.5 s a training round (#59). 10,000 rows give a model's accuracy within
# about ±1 point (95 %). No embedded-data spec reaches it (the most: 100 models × 5,415 rows);
# fesem.yaml's FEMNIST and CelebA scenarios (3,550 and 9,343 clients) do for its per-client
# methods, and the report's setup says so.
MAX_SCORED_ROWS = 1_000_000
# In a run whose full evaluations read a sample of the clients (training.full_eval_clients), a
# sampled evaluation's models on its clients' pooled test data read at most this many rows per
# row of that data (besides MAX_SCORED_ROWS): 100 per-client models on 1,000 sampled clients'
# 16,600 pooled rows (1 M rows) were 1.8 s of a 2.6 s evaluation against 0.45 s a training round
# (#59). At 5 a row K ≤ 5 cluster models read all of it, 100 per-client models 830 rows each.
SCORED_ROWS_PER_TEST_ROW = 5
# Rows an evaluation may read per row a training round trains, for `eval_train: auto`: a forward
# pass in chunks costs under half of a training step's forward and backward per row (the
# yardstick on a CPU: 1.0 ms against 2.4 ms a row), so this keeps an evaluation within a round.
EVAL_ROWS_PER_TRAINED_ROW = 2
# Logits held at once when models are applied to a whole split (bytes): models are applied in
# groups small enough for this, so a CIFAR-100 test set times 100 models stays bounded.
LOGITS_BUDGET = 64 << 20


@dataclass
class Evaluation:
    """One evaluation round's figures (rounds.parquet) and table rows as columns: metrics and
    clusters, and the method's own tables."""

    figures: dict[str, Any]
    tables: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    method_tables: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)


def evaluate(ctx: Context, method: Method, data: FederatedData, eval_batch_size: int, seed: int,
             round_number: int, clients: np.ndarray | None = None, train_split: bool = True,
             train_clients: np.ndarray | None = None, test_split: bool = True) -> Evaluation:
    """The round's figures from every client, or from the clients in `clients` (sorted ids: a
    sampled evaluation): then the metrics rows, personalized figures, global and intra/inter
    accuracy are those clients' and their pooled data's, while the clustering is still every
    client's assignment as the method holds it (IFCA: the sampled clients choose again by loss,
    the others keep their last choice). Without `train_split` only the test split is read; with
    `train_clients` (sorted ids) only those clients' training splits. Without `test_split` no test
    input or label is read (tuning's trials): the validation split (and the training split as
    asked) alone, no figure of the models on the pooled test data, Selected's choice made on each
    client's validation inputs."""
    everyone, predictor = data, method.predictor(clients)
    client_ids = np.arange(data.num_clients) if clients is None else np.asarray(clients)
    # the evaluated clients whose training split is read, by their place among the evaluated
    train_only = None if train_clients is None else np.flatnonzero(np.isin(client_ids, train_clients))
    train_split = train_split and (train_only is None or len(train_only) > 0)
    if clients is not None:
        data = data.subset(clients, train=train_split)
    scoring = _Scoring(ctx, data, everyone.num_groups, eval_batch_size, seed, round_number, clients is not None,
                       train_split, train_only, test_split, capped=clients is not None and ctx.population is not None)
    if isinstance(predictor, Mixture):
        scored = _mixture(scoring, predictor, client_ids)
    elif isinstance(predictor, Selected):
        scored = _selected(scoring, predictor)
    else:
        scored = _one_model_each(scoring, predictor.models, np.asarray(predictor.index)[client_ids])
    figures: dict[str, Any] = {}
    tables: dict[str, dict[str, np.ndarray]] = {"metrics": {}}
    for split_name, (split, preds, losses, client_model) in scored.splits.items():
        figures.update(_split_figures(tables, split_name, split, data, preds, losses, client_model,
                                      round_number, client_ids, train_only if split_name == "train" else None))
    if test_split:  # the models on the pooled test data
        figures.update(scored.model_figures(data.groups, everyone.num_groups))
    assignment = method.assignment()
    m_all = everyone.num_clients
    clusters = np.zeros(m_all, dtype=np.int64) if assignment is None else np.asarray(assignment)
    figures["n_clusters"] = int(len(np.unique(clusters)))
    sizes = np.unique(clusters, return_counts=True)[1]
    figures["singleton_clients"] = int((sizes == 1).sum())  # clients alone in their cluster
    # Where full evaluations read a sample of the clients (ctx.population), the clustering is scored
    # on them: a method that assigns clients as it evaluates them (IFCA's choice by loss) holds
    # only its last choice, or none, for the others. clusters.parquet keeps every client's.
    scored_on = slice(None) if ctx.population is None else ctx.population
    figures.update(clustering_scores(clusters[scored_on], everyone.groups[scored_on]))
    tables["clusters"] = {"round": np.full(m_all, round_number), "client": np.arange(m_all), "cluster": clusters,
                          "true_group": everyone.groups}
    own = {name: {"round": np.full(len(next(iter(columns.values()))) if columns else 0, round_number), **columns}
           for name, columns in method.eval_tables().items()}
    if everyone.mixture_weights is not None:  # how well the shares a soft method learnt tell the mixture
        figures["mixture_error"] = _mixture_error(everyone.mixture_weights, own.get("mixture"))
    return Evaluation(figures, tables, own)


@dataclass
class _Scoring:
    """What scoring a predictor needs of the round: the evaluated clients' data and settings."""

    ctx: Context
    data: FederatedData
    n_groups: int  # every client's true groups (a sample may miss some)
    chunk: int
    seed: int
    round_number: int
    sampled: bool
    train_split: bool
    train_only: np.ndarray | None = None  # the clients whose training split is read; None: all
    test_split: bool = True
    # pooled rows capped at SCORED_ROWS_PER_TEST_ROW per row: a sample of a run that samples its
    # population (runs that read every client in full evaluations keep what they read before)
    capped: bool = False

    @property
    def splits(self) -> tuple[tuple[str, Split], ...]:
        """test (unless left out), then train (unless left out), then val where the scenario has a
        validation split."""
        train = self.data.train if self.train_only is None else self.data.train.only(self.train_only)
        splits = (("test", self.data.test),) if self.test_split else ()
        splits += (("train", train),) if self.train_split else ()
        return splits + ((("val", self.data.val),) if self.data.val is not None else ())

    def pooled_rows(self, rows: int, wanted: int) -> torch.Tensor:
        """A seeded sample (by run and round, sorted) of `wanted` of the pooled test split's rows."""
        chosen = np.sort(rng(self.seed, self.round_number, 0x64).choice(rows, min(wanted, rows), replace=False))
        return torch.from_numpy(chosen).to(self.data.test.y.device)

    def scored_models(self, n_models: int, used: np.ndarray) -> np.ndarray:
        """The models scored on the pooled test data: those the evaluated clients use, or a
        seeded sample of MAX_GLOBAL_MODELS of them."""
        if len(used) <= MAX_GLOBAL_MODELS:
            return used
        return np.sort(rng(self.seed, self.round_number, 0x61).choice(
            used if self.sampled else n_models, MAX_GLOBAL_MODELS, replace=False))


@dataclass
class _Scored:
    """A predictor's predictions on each split, and each scored model's accuracy on the pooled
    test data (overall and per true group)."""

    client_model: np.ndarray
    n_models: int
    used: int
    # split → (its data, predictions, per-row losses, each client's model there)
    splits: dict[str, tuple[Split, torch.Tensor, torch.Tensor, np.ndarray]] = field(default_factory=dict)
    global_acc: dict[int, float] = field(default_factory=dict)
    group_acc: dict[int, np.ndarray] = field(default_factory=dict)
    # (clients × true groups) model each client would apply to each group's pooled test data
    # (Selected); None: its own model.
    model_for_group: np.ndarray | None = None
    scored_rows: int | None = None  # pooled test rows each scored model read, where a sample

    def score(self, j: int, correct: np.ndarray, group_of_row: np.ndarray, n_groups: int) -> None:
        self.global_acc[j] = float(correct.mean())
        if n_groups:
            self.group_acc[j] = per_client_accuracy(group_of_row, correct, n_groups)[0]

    def model_figures(self, groups: np.ndarray, n_groups: int) -> dict[str, Any]:
        accuracies = [self.global_acc[j] for j in sorted(self.global_acc)]
        figures = {"global_acc_mean": float(np.mean(accuracies)), "global_acc_std": float(np.std(accuracies)),
                   "global_models": len(accuracies), "models": self.n_models,
                   "intra_acc": float("nan"), "inter_acc": float("nan")}
        if self.scored_rows is not None:
            figures["global_rows"] = self.scored_rows
        if n_groups and len(accuracies) == self.used:
            # A sample may miss a group: it is scored on the groups its clients come from.
            group_acc = np.full((self.n_models, n_groups), np.nan)
            for j, row in self.group_acc.items():
                group_acc[j] = row
            present = np.unique(groups)
            chosen = self.client_model if self.model_for_group is None else self.model_for_group[:, present]
            figures["intra_acc"], figures["inter_acc"] = intra_inter_accuracy(
                group_acc[:, present], chosen, np.searchsorted(present, groups))
        return figures


def _one_model_each(scoring: _Scoring, models: list[torch.Tensor], client_model: np.ndarray,
                    model_for_group: np.ndarray | None = None, val_model: np.ndarray | None = None) -> _Scored:
    """Models and Selected: each client's rows predicted by its one model (on the validation
    split `val_model`'s where given: a selection made on validation inputs); a model every
    evaluated client uses, or one scored on the pooled test data, applied to the whole split."""
    data, n_models, m = scoring.data, len(models), len(client_model)
    used = np.arange(n_models) if not scoring.sampled else np.unique(np.concatenate(
        [client_model] + ([] if model_for_group is None else [model_for_group.ravel()])
        + ([] if val_model is None else [val_model])))
    scored_set = set(scoring.scored_models(n_models, used).tolist())
    result = _Scored(client_model, n_models, len(used), model_for_group=model_for_group)
    for split_name, split in scoring.splits:
        split_model = val_model if split_name == "val" and val_model is not None else client_model
        members = _members(split_model)  # the models no evaluated client uses are absent
        group_of_row = data.groups[split.owner.cpu().numpy()]
        whole = [j for j in sorted(set(members) | (scored_set if split_name == "test" else set()))
                 if (split_name == "test" and j in scored_set) or len(members.get(j, ())) == m]
        pooled_sample = None
        if split_name == "test":
            # Models scored on the pooled test data that no evaluated client shares all of it with
            # read a seeded sample of its rows once they would read over MAX_SCORED_ROWS together
            # (in a run that samples its population, over SCORED_ROWS_PER_TEST_ROW per row of that data).
            only_scored, rows = [j for j in whole if len(members.get(j, ())) != m], int(split.y.shape[0])
            most = min(MAX_SCORED_ROWS, SCORED_ROWS_PER_TEST_ROW * rows) if scoring.capped else MAX_SCORED_ROWS
            if len(only_scored) * rows > most:
                pooled_sample = scoring.pooled_rows(rows, max(1, most // len(only_scored)))
                whole = [j for j in whole if len(members.get(j, ())) == m]
        # (a sample of training splits leaves some clients without rows: their models need no pass)
        sizes, applied_whole = split.sizes(), set(whole)
        partial = [j for j in sorted(members) if sizes[members[j]].sum() and j not in applied_whole]
        preds = torch.empty_like(split.y)
        losses = torch.empty(split.y.shape[0], dtype=torch.float32, device=split.y.device)
        for j, pred, loss in _whole_split(scoring.ctx, models, whole, split, scoring.chunk):
            rows = split.rows_of(members.get(j, np.zeros(0, dtype=np.int64)))
            preds[rows], losses[rows] = pred[rows], loss[rows]
            if split_name == "test" and j in scored_set:
                result.score(j, (pred == split.y).cpu().numpy(), group_of_row, scoring.n_groups)
        if pooled_sample is not None:
            sample = _Rows(split.x[pooled_sample], split.y[pooled_sample])
            result.scored_rows = len(pooled_sample)
            for j, pred, _ in _whole_split(scoring.ctx, models, only_scored, sample, scoring.chunk):
                result.score(j, (pred == sample.y).cpu().numpy(), group_of_row[pooled_sample.cpu().numpy()],
                             scoring.n_groups)
        if partial:
            rows_of = [split.rows_of(members[j]) for j in partial]
            logits = scoring.ctx.apply_each([models[j] for j in partial], [(split.x[rows],) for rows in rows_of],
                                            chunk=scoring.chunk)
            for rows, out in zip(rows_of, logits):
                preds[rows] = out.argmax(dim=1)
                losses[rows] = F.cross_entropy(out, split.y[rows], reduction="none")
        result.splits[split_name] = (split, preds, losses, split_model)
    return result


def _members(client_model: np.ndarray) -> dict[int, np.ndarray]:
    """Each model's clients (ascending places), for the models some client uses: one sort, not
    a pass over the clients per model (10,000 per-client models a sample of 1,000 reads)."""
    order = np.argsort(client_model, kind="stable")
    models, starts = np.unique(client_model[order], return_index=True)
    return {int(j): part for j, part in zip(models, np.split(order, starts[1:]))}


def _selected(scoring: _Scoring, predictor: Selected) -> _Scored:
    """Selected: each client's test set, and each true group's pooled test set, evaluated with the
    model chosen for that data (a client's training rows with the model chosen for its test set,
    its validation rows with the one chosen for them: selection never reads test inputs)."""
    data = scoring.data
    val_model = None if data.val is None else np.array(
        [predictor.select(data.val.of(c)[0]) for c in range(data.num_clients)], dtype=np.int64)
    if not scoring.test_split:  # no test input read: each client's rows with its validation choice
        return _one_model_each(scoring, predictor.models, val_model, None, val_model)
    client_model = np.array([predictor.select(data.test.of(c)[0]) for c in range(data.num_clients)],
                            dtype=np.int64)
    model_for_group = None
    if scoring.n_groups:
        test_groups = data.groups[data.test.owner.cpu().numpy()]
        chosen = [predictor.select(data.test.x[torch.from_numpy(test_groups == h).to(data.test.x.device)])
                  for h in range(scoring.n_groups)]
        model_for_group = np.tile(np.array(chosen, dtype=np.int64), (data.num_clients, 1))
    return _one_model_each(scoring, predictor.models, client_model, model_for_group, val_model)


def _mixture(scoring: _Scoring, predictor: Mixture, client_ids: np.ndarray) -> _Scored:
    """Mixture: each row predicted by its client's mixture; each component model scored alone on
    the pooled test data (every evaluated client uses every component)."""
    data, models = scoring.data, predictor.models
    weights = np.asarray(predictor.weights)[client_ids]
    used = np.arange(len(models))
    result = _Scored(np.argmax(weights, axis=1).astype(np.int64), len(models), len(used))
    for split_name, split in scoring.splits:
        preds, losses = _mixture_predictions(scoring.ctx, predictor, weights, split, client_ids, scoring.chunk)
        if split_name == "test":
            group_of_row = data.groups[split.owner.cpu().numpy()]
            for j in scoring.scored_models(len(models), used):
                correct = (_whole(scoring.ctx, models[j], split, scoring.chunk)[0] == split.y).cpu().numpy()
                result.score(int(j), correct, group_of_row, scoring.n_groups)
        result.splits[split_name] = (split, preds, losses, result.client_model)
    return result


def _mixture_error(true_weights: np.ndarray, table: dict[str, np.ndarray] | None) -> float:
    """metrics.mixture_error of a soft method's `mixture` table (client, cluster, weight); nan for
    a method without shares."""
    if table is None:
        return float("nan")
    shares = np.zeros((len(true_weights), int(np.max(table["cluster"])) + 1))
    shares[table["client"], table["cluster"]] = table["weight"]
    return mixture_error(true_weights, shares) if np.isfinite(shares).all() else float("nan")


def _split_figures(tables: dict, split_name: str, split: Split, data: FederatedData, preds: torch.Tensor,
                   losses: torch.Tensor, client_model: np.ndarray, round_number: int,
                   client_ids: np.ndarray, only: np.ndarray | None = None) -> dict[str, Any]:
    """Each client's figures on one split (metrics rows, under the clients' own ids; of the
    clients in `only` where given) and the round's summary of them."""
    m, owner = data.num_clients, split.owner.cpu().numpy()
    y_true, y_pred = split.y.cpu().numpy(), preds.cpu().numpy()
    acc, n = per_client_accuracy(owner, y_true == y_pred, m)
    loss_c = per_client_mean(owner, losses.cpu().numpy(), m)
    f1 = per_client_f1(owner, y_true, y_pred, m, data.num_classes)
    keep = slice(None) if only is None else only
    acc, n, loss_c, f1 = acc[keep], n[keep], loss_c[keep], f1[keep]
    _extend(tables, "metrics", {"round": np.full(len(acc), round_number), "client": client_ids[keep],
                                "split": np.full(len(acc), split_name), "model": client_model[keep],
                                "group": data.groups[keep], "acc": acc, "loss": loss_c, "f1": f1, "n": n})
    figures: dict[str, Any] = {}
    if split_name == "test":
        figures.update(personalized_summary(acc, n))
        figures["loss"] = float(losses.double().mean()) if len(y_true) else float("nan")
        figures.update(device_f1(f1, n))
        # not FeSEM's: one class-macro F1 of every client's predictions pooled
        figures["f1_pooled"] = f1_macro_over_classes(y_true, y_pred, data.num_classes)
    elif split_name == "val":  # what selection reads (the best round, tuning), never the test split
        figures["val_acc_macro"] = personalized_summary(acc, n)["acc_macro"]
        figures["val_loss"] = float(losses.double().mean()) if len(y_true) else float("nan")
    else:
        figures["train_acc_macro"] = float(np.nanmean(acc))
    return figures


def evaluated_population(data: FederatedData, training, seed: int) -> np.ndarray | None:
    """The clients a full evaluation reads (training.full_eval_clients; sorted ids, None: every
    client): the first of a seeded order of the clients (by the run's seed alone, so every method
    of a scenario reads the same ones and a larger sample holds a smaller one)."""
    m = data.num_clients
    wanted = evaluated_clients(training, m, bool(data.moves))
    if wanted >= m:
        return None
    return np.sort(rng(seed, 0x65).permutation(m)[:wanted])


def train_split_clients(data: FederatedData, training, seed: int, trainers: np.ndarray | None = None,
                        population: np.ndarray | None = None) -> np.ndarray | None:
    """The clients whose training split evaluations read (sorted ids; None: every client's):
    `training.eval_train` true: all, false: none; auto: all where an evaluation of every client's
    test, validation and training split reads at most EVAL_ROWS_PER_TRAINED_ROW rows per row a
    training round of FedAvg trains (clients_per_round of the clients that train, `trainers`,
    at their mean local steps × batch), else the clients of a seeded order (by the run's seed
    alone: every evaluation of the run reads the same ones, as do methods with the same budget) as long as their
    rows fit what the test and validation splits leave of that budget. With `population` (a full
    evaluation's sample, sorted ids) the evaluated clients are those: their splits are counted and
    the order is theirs."""
    from cflpipe.fl.local import steps_for

    if training.eval_train is True:
        return None
    if training.eval_train is False:
        return np.zeros(0, dtype=np.int64)
    sizes = data.train.sizes()
    training_sizes = sizes[trainers] if trainers is not None else sizes[sizes > 0]
    per_client = [steps_for(int(n), training.batch_size, training.local_steps, training.local_epochs)
                  * min(training.batch_size, int(n)) for n in training_sizes]
    trained = training.clients_per_round * (float(np.mean(per_client)) if per_client else 0.0)
    read = slice(None) if population is None else population
    budget = EVAL_ROWS_PER_TRAINED_ROW * trained - (int(data.test.sizes()[read].sum()) if training.eval_test else 0) \
        - (0 if data.val is None else int(data.val.sizes()[read].sum()))
    if sizes[read].sum() <= budget:
        return None if population is None else population
    order = rng(seed, 0x63).permutation(len(sizes))
    if population is not None:
        order = order[np.isin(order, population)]
    fits = np.cumsum(sizes[order]) <= budget
    return np.sort(order[:int(np.argmin(fits)) if not fits.all() else len(order)])


def _whole(ctx: Context, model: torch.Tensor, split: Split, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One model's predictions and per-row losses on a whole split."""
    (_, pred, loss), = _whole_split(ctx, [model], [0], split, chunk)
    return pred, loss


def _mixture_predictions(ctx: Context, predictor: Mixture, weights: np.ndarray, split: Split,
                         client_ids: np.ndarray, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row predicted by its client's mixture Σ_k π_ik·softmax(model_k(x)) (FedEM's
    prediction; π_ik per row where the method's weights depend on the input, FedGMM's), and its
    negative log-likelihood under that mixture. `weights`: the evaluated clients' rows."""
    logits = ctx.apply(predictor.models, split.x, chunk=chunk)  # (K × rows × classes)
    per_row = (torch.as_tensor(weights, device=logits.device)[split.owner] if predictor.rows is None
               else predictor.rows(split.x, client_ids[split.owner.cpu().numpy()]))
    per_row = per_row.to(dtype=logits.dtype, device=logits.device)  # (rows × K)
    probabilities = torch.einsum("nk,knc->nc", per_row, logits.softmax(dim=-1))
    preds = probabilities.argmax(dim=1)
    picked = probabilities.gather(1, split.y[:, None])[:, 0]
    return preds, -picked.clamp_min(torch.finfo(picked.dtype).tiny).log().to(torch.float32)


@dataclass
class _Rows:
    """Some rows of a split, as _whole_split reads them."""

    x: torch.Tensor
    y: torch.Tensor


def _whole_split(ctx: Context, models: list[torch.Tensor], which: list[int], split: "Split | _Rows", chunk: int):
    """(j, predictions, per-row losses) of models[j] on the whole split, for j in `which`,
    applied in groups whose logits fit LOGITS_BUDGET."""
    if not which:
        return
    classes = int(ctx.data.num_classes)
    per_model = max(1, int(split.y.shape[0]) * classes * 4)
    group = max(1, LOGITS_BUDGET // per_model)
    for start in range(0, len(which), group):
        chosen = which[start:start + group]
        logits = ctx.apply([models[j] for j in chosen], split.x, chunk=chunk)
        for j, out in zip(chosen, logits):
            yield j, out.argmax(dim=1), F.cross_entropy(out, split.y, reduction="none")


def _extend(tables: dict[str, dict[str, np.ndarray]], table: str, columns: dict[str, np.ndarray]) -> None:
    target = tables.setdefault(table, {})
    for key, values in columns.items():
        target[key] = np.concatenate([target[key], np.asarray(values)]) if key in target else np.asarray(values)
