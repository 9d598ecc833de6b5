"""SR-FCA (reconstructed from the authors' code, #46 item 3): the trimmed mean, the pivot correlation
clustering, λ from the pairwise distances, and a run that recovers two label-swap groups."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import trim_mean

from cflpipe.fl.engine import train_run
from cflpipe.methods.srfca import correlation_clusters, pair_threshold, trimmed_mean
from cflpipe.spec import parse_spec


@pytest.mark.parametrize("n, beta", [(10, 0.15), (7, 0.3), (4, 0.25)])
def test_the_trimmed_mean_is_scipys(n, beta):
    x = torch.randn(n, 5, generator=torch.Generator().manual_seed(n), dtype=torch.float64)
    np.testing.assert_allclose(trimmed_mean(x, beta).numpy(), trim_mean(x.numpy(), beta, axis=0))


def test_the_trimmed_mean_is_the_mean_when_nothing_or_too_little_would_be_left():
    x = torch.arange(12.0).reshape(3, 4)
    assert torch.equal(trimmed_mean(x, 0.0), x.mean(0))
    assert torch.equal(trimmed_mean(x, 0.4), x.mean(0))  # int(1.2) = 1 cut each end leaves 1 < 2


def test_correlation_clustering_finds_cliques_whatever_the_pivots():
    edges = np.zeros((6, 6), dtype=bool)
    for group in ([0, 2, 4], [1, 3, 5]):
        edges[np.ix_(group, group)] = True
    for seed in range(5):
        labels = correlation_clusters(edges, np.random.default_rng(seed))
        assert len(set(labels[[0, 2, 4]])) == len(set(labels[[1, 3, 5]])) == 1 and labels[0] != labels[1]
    assert sorted(correlation_clusters(np.eye(4, dtype=bool), np.random.default_rng(0))) == [0, 1, 2, 3]
    path = np.eye(3, dtype=bool) | np.eye(3, k=1, dtype=bool) | np.eye(3, k=-1, dtype=bool)  # 0-1-2
    a, b = (correlation_clusters(path, np.random.default_rng(s)) for s in (7, 7))
    assert np.array_equal(a, b)  # seeded


def test_lambda_is_the_quantile_of_the_pairwise_distances():
    d = np.array([[0, 1, 4, 5], [1, 0, 2, 6], [4, 2, 0, 3], [5, 6, 3, 0]], dtype=float)
    assert pair_threshold(d, 0.25) == 2.0  # pairs 1 2 3 4 5 6: the ceil(1.5) = 2nd smallest
    assert pair_threshold(d, 1.0) == 6.0 and pair_threshold(d, 0.01) == 1.0


def test_a_run_groups_the_clients_once_and_recovers_two_label_swap_groups(tmp_path):
    spec = parse_spec({"seeds": [0], "results_dir": str(tmp_path / "r"), "data_dir": str(tmp_path / "d"),
                       "training": {"model": "mlp", "rounds": 12, "clients_per_round": 8, "local_steps": 10,
                                    "batch_size": 32, "lr": 0.05, "eval_every": 6, "device": "cpu"},
                       "scenarios": {"s": {"dataset": "digits", "clients": 8, "pool": "train",
                                           "partition": [{"kind": "iid"}, {"kind": "label_swap", "groups": 2}]}},
                       "methods": {"srfca": {"init_steps": 60}}})
    run = train_run(spec, "s", "srfca", 0, progress=False)
    rounds = pd.read_parquet(run.run_dir / "rounds.parquet")
    assert rounds.dropna(subset=["srfca_lambda"])["round"].tolist() == [1]  # the one-shot start
    assert rounds.dropna(subset=["srfca_merged"])["round"].tolist() == [7]  # between the two refine blocks
    assert json.loads((run.run_dir / "summary.json").read_text())["final"]["ari"] == pytest.approx(1.0)
