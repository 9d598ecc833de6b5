"""FedSoft: importance weights, the client's pull, the centers' aggregation and the mixture table."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from cflpipe.fl.engine import prepare_run
from cflpipe.fl.local import LocalResult
from cflpipe.fl.method import Update
from cflpipe.methods.fedsoft import importance_weights
from cflpipe.spec import parse_spec
from cflpipe.testing import spec_dict


def test_importance_is_the_share_of_samples_each_cluster_fits_best():
    # 3 clusters × 6 samples; client 0 owns samples 0-3, client 1 samples 4-5
    losses = np.array([[0.1, 0.9, 0.5, 0.2, 0.7, 0.8],
                       [0.3, 0.2, 0.4, 0.2, 0.1, 0.9],
                       [0.9, 0.8, 0.6, 0.5, 0.9, 0.3]])
    owner = np.array([0, 0, 0, 0, 1, 1])
    u = importance_weights(losses, owner, clients=3, smoother=1e-4)
    # client 0: cluster 0 wins samples 0 and 3 (a tie goes to the lower index), cluster 1 samples 1 and 2
    assert u[0] == pytest.approx([0.5, 0.5, 1e-4])
    assert u[1] == pytest.approx([1e-4, 0.5, 0.5])
    assert u[2] == pytest.approx([1e-4, 1e-4, 1e-4])  # no samples: every share smoothed


def _run(tmp_path: Path):
    raw = spec_dict(tmp_path, "fedsoft", clients_per_round=6)
    raw["methods"]["fedsoft"] = {"clusters": 2, "lam": 0.5}
    run = prepare_run(parse_spec(raw), "s", "fedsoft", 0)
    run.method.round_start(np.arange(6))
    return run


def test_an_estimation_round_counts_the_centers_only_for_clients_not_sampled(tmp_path):
    raw = spec_dict(tmp_path, "fedsoft", clients_per_round=2)
    raw["methods"]["fedsoft"] = {"clusters": 2}
    run = prepare_run(parse_spec(raw), "s", "fedsoft", 0)
    run.method.round_start(np.array([1, 4]))
    centers = run.method.centers.numel() * run.method.centers.element_size()
    assert run.ctx.extra_bytes_down == 4 * centers  # 6 clients, 2 sampled (they get them in the payload)
    assert run.ctx.extra_bytes_up == 6 * 2 * 8  # every client's two float64 shares


def test_the_pull_goes_to_the_share_weighted_mean_of_the_centers(tmp_path):
    run = _run(tmp_path)
    method, centers = run.method, run.method.centers
    u = method.importance[2]
    plan, _ = type(method).client_plan(run.ctx.view(2), method.payload(2))
    (anchor,) = plan.anchors
    assert anchor.strength == 0.5
    expected = (u[0] * centers[0] + u[1] * centers[1]) / u.sum()
    assert torch.allclose(anchor.vector, expected.to(anchor.vector.dtype), rtol=1e-6, atol=1e-7)
    assert torch.equal(plan.start, run.ctx.init)  # the local model starts from the run's initial model


def test_centers_average_the_local_models_by_importance_and_size(tmp_path):
    run = _run(tmp_path)
    method = run.method
    g = torch.Generator().manual_seed(0)
    dim = method.centers.shape[1]
    updates = {c: Update({"model": torch.randn(dim, generator=g)}, n, LocalResult(1.0, 1, n))
               for c, n in ((1, 10), (3, 30), (4, 20))}
    models = {c: u.tensors["model"].clone() for c, u in updates.items()}
    method.aggregate(updates)
    for s in range(2):
        weights = {c: method.importance[c, s] * updates[c].n for c in updates}
        expected = sum(weights[c] * models[c] for c in updates) / sum(weights.values())
        assert torch.allclose(method.centers[s], expected.to(method.centers.dtype), rtol=1e-5, atol=1e-6)


def test_clusters_are_the_largest_shares_and_the_mixture_is_recorded(tmp_path):
    run = _run(tmp_path)
    method = run.method
    method.importance = np.array([[0.7, 0.3], [0.2, 0.8], [0.5, 0.5], [1e-4, 1.0], [0.6, 0.4], [0.1, 0.9]])
    assert method.assignment().tolist() == [0, 1, 0, 1, 0, 1]
    table = method.eval_tables()["mixture"]
    weights = table["weight"].reshape(6, 2)
    assert np.allclose(weights.sum(axis=1), 1.0)
    assert weights[3] == pytest.approx([1e-4 / 1.0001, 1 / 1.0001])
    assert table["client"].tolist()[:4] == [0, 0, 1, 1] and table["cluster"].tolist()[:4] == [0, 1, 0, 1]


def test_the_ari_table_says_a_soft_method_is_scored_by_its_largest_shares():
    import pandas as pd

    from cflpipe.report.tables import TableSpec, paper_table

    frame = pd.DataFrame([{"scenario": "s", "method": m, "seed": k, "ari": 1.0, "acc_macro": 0.9}
                          for m in ("soft", "ifca") for k in (0, 1)])
    ari = TableSpec("ari", "ARI", "ari", 1.0, 2, direction=1)
    table = paper_table(frame, ["s"], ["soft", "ifca"], ari, {"soft": "fedsoft"}, method_labels={"soft": "FedSoft"})
    assert table.notes[-1] == ("FedSoft: soft clustering (every client in every cluster, in shares: mixture.parquet); "
                               "scored with each client's largest share.")
    accuracy = paper_table(frame, ["s"], ["soft", "ifca"], TableSpec("acc", "acc", "acc_macro", 100.0, 1),
                           {"soft": "fedsoft"})
    assert not any("soft clustering" in note for note in accuracy.notes)
