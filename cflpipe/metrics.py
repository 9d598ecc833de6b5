"""Metrics as METHODS.md defines them. Inputs are per-sample predictions with the client (or
model) they belong to, so every figure is a bincount, not a Python loop over clients."""

from __future__ import annotations

import math

import numpy as np

NAN = float("nan")


def per_client_accuracy(owner: np.ndarray, correct: np.ndarray, num_clients: int) -> tuple[np.ndarray, np.ndarray]:
    """(accuracy, n) per client; accuracy is nan for a client with no samples."""
    n = np.bincount(owner, minlength=num_clients)
    hits = np.bincount(owner, weights=correct.astype(np.float64), minlength=num_clients)
    with np.errstate(invalid="ignore", divide="ignore"):
        return hits / n, n


def per_client_mean(owner: np.ndarray, values: np.ndarray, num_clients: int) -> np.ndarray:
    n = np.bincount(owner, minlength=num_clients)
    total = np.bincount(owner, weights=values.astype(np.float64), minlength=num_clients)
    with np.errstate(invalid="ignore", divide="ignore"):
        return total / n


def per_client_f1(owner: np.ndarray, y_true: np.ndarray, y_pred: np.ndarray, num_clients: int,
                  num_classes: int) -> np.ndarray:
    """Macro F1 of each client's predictions over the labels present in its true or predicted
    labels (scikit-learn's f1_score(average='macro', zero_division=0) per client)."""
    cells = num_clients * num_classes

    def counts(rows: np.ndarray, labels: np.ndarray) -> np.ndarray:
        return np.bincount(rows * num_classes + labels, minlength=cells).reshape(num_clients, num_classes)

    true_count, pred_count = counts(owner, y_true), counts(owner, y_pred)
    hit = y_true == y_pred
    tp = counts(owner[hit], y_true[hit])
    denominator = true_count + pred_count
    with np.errstate(invalid="ignore", divide="ignore"):
        f1 = np.where(denominator > 0, 2 * tp / np.maximum(denominator, 1), 0.0)
    present = denominator > 0
    counts = present.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, (f1 * present).sum(axis=1) / np.maximum(counts, 1), NAN)


def f1_macro_over_classes(y_true: np.ndarray, y_pred: np.ndarray, num_classes: int) -> float:
    owner = np.zeros(len(y_true), dtype=np.int64)
    return float(per_client_f1(owner, y_true, y_pred, 1, num_classes)[0])


def device_f1(f1: np.ndarray, n: np.ndarray) -> dict[str, float]:
    """FeSEM's F1 over devices (Sec. 6.2): `f1_micro` weights each client's F1 by its number of
    test samples, `f1_macro` averages them plainly (clients without test samples left out)."""
    valid = (n > 0) & np.isfinite(f1)
    if not valid.any():
        return {"f1_micro": NAN, "f1_macro": NAN}
    return {"f1_micro": float(np.average(f1[valid], weights=n[valid])), "f1_macro": float(np.mean(f1[valid]))}


def personalized_summary(acc: np.ndarray, n: np.ndarray) -> dict[str, float]:
    """Macro (mean over clients), micro (weighted by samples), std and the mean of the worst
    10 % of clients (at least one client)."""
    valid = n > 0
    acc, n = acc[valid], n[valid]
    if len(acc) == 0:
        return {"acc_macro": NAN, "acc_micro": NAN, "acc_std": NAN, "acc_worst10": NAN}
    worst = np.sort(acc)[: max(1, math.ceil(0.1 * len(acc)))]
    return {
        "acc_macro": float(acc.mean()),
        "acc_micro": float((acc * n).sum() / n.sum()),
        "acc_std": float(acc.std()),
        "acc_worst10": float(worst.mean()),
    }


def clustering_scores(assignment: np.ndarray, groups: np.ndarray) -> dict[str, float]:
    """ARI / NMI / AMI of a client→cluster assignment against ground-truth groups; nan when the
    scenario has no ground truth."""
    if len(groups) == 0 or (groups < 0).any():
        return {"ari": NAN, "nmi": NAN, "ami": NAN}
    # Imported here: scikit-learn's import costs about a second, which runs without ground truth
    # (and the CLI's other commands) need not pay.
    from sklearn.metrics import adjusted_mutual_info_score, adjusted_rand_score, normalized_mutual_info_score

    return {
        "ari": float(adjusted_rand_score(groups, assignment)),
        "nmi": float(normalized_mutual_info_score(groups, assignment)),
        "ami": float(adjusted_mutual_info_score(groups, assignment)),
    }


def mixture_error(true_weights: np.ndarray, shares: np.ndarray) -> float:
    """How far a soft method's shares are from the weights its clients' data were mixed with: the
    mean over clients of the total variation ½·Σ|w − s| (0: exact, 1: disjoint), after matching
    the method's clusters to the groups so that the shares agree most (Hungarian assignment on
    Σ_i w_ig·s_ik; a cluster left unmatched counts as share on no group, a group left unmatched
    as a weight no cluster holds). `true_weights` (clients × groups), `shares` (clients ×
    clusters), rows summing to 1."""
    from scipy.optimize import linear_sum_assignment

    w, s = np.asarray(true_weights, dtype=np.float64), np.asarray(shares, dtype=np.float64)
    group, cluster = linear_sum_assignment(w.T @ s, maximize=True)
    matched = np.zeros_like(w)
    matched[:, group] = s[:, cluster]
    unmatched = s.sum(axis=1) - s[:, cluster].sum(axis=1)
    return float(np.mean(0.5 * (np.abs(w - matched).sum(axis=1) + unmatched)))


def intra_inter_accuracy(group_acc: np.ndarray, client_model: np.ndarray, groups: np.ndarray,
                         ) -> tuple[float, float]:
    """AWCFL/MCFL's intra- and inter-cluster accuracy.

    group_acc[j, g] is model j's accuracy on the pooled test data of ground-truth group g.
    client_model is each client's model index, or a (clients × groups) matrix of the model a
    client applies to each group's data (MCFL chooses by the data). Each client is scored on its
    own group's data (intra) and on the other groups' data (inter); both are averaged over
    clients. nan without ground truth or with a single group."""
    if (groups < 0).any() or group_acc.shape[1] < 2:
        return NAN, NAN
    if client_model.ndim == 1:
        rows = group_acc[client_model]  # (clients × groups)
    else:
        rows = group_acc[client_model, np.arange(group_acc.shape[1])[None, :]]
    own = rows[np.arange(len(groups)), groups]
    others = (rows.sum(axis=1) - own) / (rows.shape[1] - 1)
    return float(np.nanmean(own)), float(np.nanmean(others))


def tensor_bytes(*tensors) -> int:
    """Bytes of the tensors as they would travel (numel × element size)."""
    return int(sum(t.numel() * t.element_size() for t in tensors))
