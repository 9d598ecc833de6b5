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
from cflpipe.fl.method import Context, Method, sampled_hook_applies
from cflpipe.seeds import rng
from cflpipe.metrics import (clustering_scores, mixture_error, device_f1, f1_macro_over_classes, intra_inter_accuracy,
                             per_client_accuracy, per_client_f1, per_client_mean, personalized_summary)

# Global accuracy and intra/inter accuracy score every distinct model on all clients' pooled
# test data; with per-client models that is clients × pooled test, so a seeded sample of at most
# this many models is scored (recorded in rounds.parquet as `global_models`).
MAX_GLOBAL_MODELS = 100
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
             round_number: int, clients: np.ndarray | None = None, train_split: bool = True) -> Evaluation:
    """The round's figures from every client, or from the clients in `clients` (sorted ids: a
    sampled evaluation): then the metrics rows, personalized figures, global and intra/inter
    accuracy are those clients' and their pooled data's, while the clustering is still every
    client's assignment as the method holds it (IFCA: the sampled clients choose again by loss,
    the others keep their last choice). Without `train_split` only the test split is read."""
    everyone = data
    models, client_model = method.eval_models() if clients is None else _sampled_models(method, clients)
    mixture = method.eval_mixture()
    client_ids = np.arange(data.num_clients)
    if clients is not None:
        data, client_ids = data.subset(clients, train=train_split), np.asarray(clients)
        client_model = np.asarray(client_model)[clients]
        mixture = None if mixture is None else mixture[clients]
    m = data.num_clients
    groups = data.groups
    n_groups = everyone.num_groups
    model_for_group = None
    if method.selects_by_data:
        client_model = np.array([method.select_model(data.test.of(c)[0]) for c in range(m)], dtype=np.int64)
        if n_groups:
            test_groups = groups[data.test.owner.cpu().numpy()]
            chosen = [method.select_model(data.test.x[torch.from_numpy(test_groups == h).to(data.test.x.device)])
                      for h in range(n_groups)]
            model_for_group = np.tile(np.array(chosen, dtype=np.int64), (m, 1))
    n_models = len(models)
    # The models the evaluated clients use; a sampled evaluation scores only these (a mixture's
    # clients use every component).
    used = np.arange(n_models) if clients is None or mixture is not None else np.unique(
        client_model if model_for_group is None else np.concatenate([client_model, model_for_group.ravel()]))
    scored = used
    if len(used) > MAX_GLOBAL_MODELS:
        scored = np.sort(rng(seed, round_number, 0x61).choice(
            n_models if clients is None else used, MAX_GLOBAL_MODELS, replace=False))
    scored_set = set(scored.tolist())
    global_acc, group_acc = [], np.full((n_models, max(n_groups, 1)), np.nan)
    figures: dict[str, Any] = {}
    tables: dict[str, dict[str, np.ndarray]] = {"metrics": {}}
    if mixture is not None:  # a client's model is its mixture; its `model` column the largest share
        client_model = np.argmax(mixture, axis=1).astype(np.int64)
    for split_name, split in (("test", data.test), ("train", data.train))[:2 if train_split else 1]:
        owner = split.owner.cpu().numpy()
        if mixture is not None:
            preds, losses = _mixture_predictions(ctx, method, models, mixture, split, client_ids, eval_batch_size)
            if split_name == "test":
                for j in scored:
                    correct = (_whole(ctx, models[j], split, eval_batch_size)[0] == split.y).cpu().numpy()
                    global_acc.append(float(correct.mean()))
                    if n_groups:
                        group_acc[j, :n_groups] = per_client_accuracy(groups[owner], correct, n_groups)[0]
            figures.update(_split_figures(tables, split_name, split, data, owner, preds, losses, client_model,
                                          groups, round_number, client_ids))
            continue
        members = [np.nonzero(client_model == j)[0] for j in range(n_models)]
        # A model applied to the whole split: scored on the pooled test data, or every client's.
        whole = [j for j in range(n_models) if (split_name == "test" and j in scored_set) or len(members[j]) == m]
        partial = [j for j in range(n_models) if len(members[j]) and j not in set(whole)]
        preds = torch.empty_like(split.y)
        losses = torch.empty(split.y.shape[0], dtype=torch.float32, device=split.y.device)
        for j, pred, loss in _whole_split(ctx, models, whole, split, eval_batch_size):
            rows = split.rows_of(members[j])
            preds[rows], losses[rows] = pred[rows], loss[rows]
            if split_name == "test" and j in scored_set:
                correct = (pred == split.y).cpu().numpy()
                global_acc.append(float(correct.mean()))
                if n_groups:
                    group_acc[j, :n_groups] = per_client_accuracy(groups[owner], correct, n_groups)[0]
        if partial:
            rows_of = [split.rows_of(members[j]) for j in partial]
            logits = ctx.apply_each([models[j] for j in partial], [(split.x[rows],) for rows in rows_of],
                                    chunk=eval_batch_size)
            for rows, out in zip(rows_of, logits):
                preds[rows] = out.argmax(dim=1)
                losses[rows] = F.cross_entropy(out, split.y[rows], reduction="none")
        figures.update(_split_figures(tables, split_name, split, data, owner, preds, losses, client_model,
                                      groups, round_number, client_ids))
    figures["global_acc_mean"] = float(np.mean(global_acc))
    figures["global_acc_std"] = float(np.std(global_acc))
    figures["global_models"] = len(global_acc)
    figures["models"] = n_models
    if n_groups and len(scored) == len(used):
        # A sample may miss a group: it is scored on the groups its clients come from.
        present = np.unique(groups)
        chosen = client_model if model_for_group is None else model_for_group[:, present]
        figures["intra_acc"], figures["inter_acc"] = intra_inter_accuracy(
            group_acc[:, present], chosen, np.searchsorted(present, groups))
    else:
        figures["intra_acc"] = figures["inter_acc"] = float("nan")
    assignment = method.assignment()
    m_all = everyone.num_clients
    clusters = np.zeros(m_all, dtype=np.int64) if assignment is None else np.asarray(assignment)
    figures["n_clusters"] = int(len(np.unique(clusters)))
    figures.update(clustering_scores(clusters, everyone.groups))
    tables["clusters"] = {"round": np.full(m_all, round_number), "client": np.arange(m_all), "cluster": clusters,
                          "true_group": everyone.groups}
    own = {}
    for name, columns in method.eval_tables().items():
        length = len(next(iter(columns.values()))) if columns else 0
        own[name] = {"round": np.full(length, round_number), **columns}
    if everyone.mixture_weights is not None:  # how well the shares a soft method learnt tell the mixture
        figures["mixture_error"] = _mixture_error(everyone.mixture_weights, own.get("mixture"))
    return Evaluation(figures, tables, own)


def _mixture_error(true_weights: np.ndarray, table: dict[str, np.ndarray] | None) -> float:
    """metrics.mixture_error of a soft method's `mixture` table (client, cluster, weight); nan for
    a method without shares."""
    if table is None:
        return float("nan")
    shares = np.zeros((len(true_weights), int(np.max(table["cluster"])) + 1))
    shares[table["client"], table["cluster"]] = table["weight"]
    return mixture_error(true_weights, shares) if np.isfinite(shares).all() else float("nan")


def _sampled_models(method: Method, clients: np.ndarray) -> tuple[list[torch.Tensor], np.ndarray]:
    """eval_models_of(clients), unless a subclass overrides eval_models below the class that
    gives eval_models_of (a plugin's): then eval_models, which it meant to be used."""
    return method.eval_models_of(clients) if sampled_hook_applies(type(method), "eval_models_of", "eval_models") \
        else method.eval_models()


def _split_figures(tables: dict, split_name: str, split: Split, data: FederatedData, owner: np.ndarray,
                   preds: torch.Tensor, losses: torch.Tensor, client_model: np.ndarray, groups: np.ndarray,
                   round_number: int, client_ids: np.ndarray) -> dict[str, Any]:
    """Each client's figures on one split (metrics rows, under the clients' own ids) and the
    round's summary of them."""
    m = data.num_clients
    y_true, y_pred = split.y.cpu().numpy(), preds.cpu().numpy()
    acc, n = per_client_accuracy(owner, y_true == y_pred, m)
    loss_c = per_client_mean(owner, losses.cpu().numpy(), m)
    f1 = per_client_f1(owner, y_true, y_pred, m, data.num_classes)
    _extend(tables, "metrics", {"round": np.full(m, round_number), "client": client_ids,
                                "split": np.full(m, split_name), "model": client_model, "group": groups,
                                "acc": acc, "loss": loss_c, "f1": f1, "n": n})
    figures: dict[str, Any] = {}
    if split_name == "test":
        figures.update(personalized_summary(acc, n))
        figures["loss"] = float(losses.double().mean()) if len(y_true) else float("nan")
        figures.update(device_f1(f1, n))
        # not FeSEM's: one class-macro F1 of every client's predictions pooled
        figures["f1_pooled"] = f1_macro_over_classes(y_true, y_pred, data.num_classes)
    else:
        figures["train_acc_macro"] = float(np.nanmean(acc))
    return figures


def _whole(ctx: Context, model: torch.Tensor, split: Split, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One model's predictions and per-row losses on a whole split."""
    (_, pred, loss), = _whole_split(ctx, [model], [0], split, chunk)
    return pred, loss


def _mixture_predictions(ctx: Context, method: Method, models: list[torch.Tensor], mixture: np.ndarray,
                         split: Split, client_ids: np.ndarray, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row predicted by its client's mixture Σ_k π_ik·softmax(model_k(x)) (FedEM's
    prediction; π_ik per row where the method's weights depend on the input, FedGMM's), and its
    negative log-likelihood under that mixture."""
    logits = ctx.apply(models, split.x, chunk=chunk)  # (K × rows × classes)
    rows = method.row_mixture(split.x, client_ids[split.owner.cpu().numpy()])
    weights = (torch.as_tensor(mixture, device=logits.device)[split.owner] if rows is None else rows)
    weights = weights.to(dtype=logits.dtype, device=logits.device)  # (rows × K)
    probabilities = torch.einsum("nk,knc->nc", weights, logits.softmax(dim=-1))
    preds = probabilities.argmax(dim=1)
    picked = probabilities.gather(1, split.y[:, None])[:, 0]
    return preds, -picked.clamp_min(torch.finfo(picked.dtype).tiny).log().to(torch.float32)


def _whole_split(ctx: Context, models: list[torch.Tensor], which: list[int], split: Split, chunk: int):
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
