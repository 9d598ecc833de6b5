"""SR-FCA (reconstructed from the authors' code, #46 item 3): the trimmed mean, the pivot correlation
clustering, λ from the pairwise distances, and a run that recovers two label-swap groups."""

from __future__ import annotations

import json
import warnings
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import trim_mean
from sklearn.metrics import adjusted_rand_score

from cflpipe.fl.engine import train_run
from cflpipe.methods.srfca import SRFCA, correlation_clusters, pair_threshold, trimmed_mean
from cflpipe.spec import parse_spec


@pytest.mark.parametrize("n, trim", [(10, 0.15), (7, 0.3), (6, 0.15), (4, 0.25)])
def test_the_trimmed_mean_keeps_the_authors_ranks(n, trim):
    x = torch.randn(n, 5, generator=torch.Generator().manual_seed(n), dtype=torch.float64)
    low, high = int(trim * n), int((1 - trim) * n)  # their rows [int(βn), int((1−β)n))
    expected = np.sort(x.numpy(), axis=0)[low:high].mean(0)
    np.testing.assert_allclose(trimmed_mean(x, trim).numpy(), expected)
    if n == 10:  # one value left out below, two above: not scipy's symmetric cut
        assert not np.allclose(expected, trim_mean(x.numpy(), trim, axis=0))


def test_the_trimmed_mean_is_the_mean_when_nothing_or_too_little_would_be_left():
    x = torch.arange(12.0).reshape(3, 4)
    assert torch.equal(trimmed_mean(x, 0.0), x.mean(0))
    assert torch.equal(trimmed_mean(x, 0.4), x.mean(0))  # ranks [1, 1): nothing left


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


def test_lambda_is_the_sorted_distance_at_the_authors_index():
    d = np.array([[0, 1, 4, 5], [1, 0, 2, 6], [4, 2, 0, 3], [5, 6, 3, 0]], dtype=float)
    assert pair_threshold(d, 0.25) == 3.0  # pairs 1 2 3 4 5 6: 0-based index ceil(1.5) = 2
    assert pair_threshold(d, 1.0) == 6.0 and pair_threshold(d, 0.01) == 2.0
    d[0, 1] = np.nan  # a pair without a distance is left out: 2 3 4 5 6
    assert pair_threshold(d, 0.25) == 4.0


def method(losses: np.ndarray, clusters: list[int], size_threshold: int, lam: float = 1.0) -> SRFCA:
    """An SR-FCA server with the local losses L given, without a run."""
    m = SRFCA.__new__(SRFCA)
    m.ctx = SimpleNamespace(num_clients=len(losses), init=torch.zeros(3), rng=lambda *p: np.random.default_rng(0))
    m.hp = SimpleNamespace(size_threshold=size_threshold, threshold=lam, dist_fraction=0.25)
    m.local_losses, m.lam, m._metrics = losses.astype(float), lam, {}
    m.clusters = np.array(clusters)
    m.centers = torch.zeros(max(clusters) + 1, 3)
    return m


def canon(labels) -> list[int]:
    """Cluster labels renumbered by first appearance (the pivots number clusters at random)."""
    seen: dict[int, int] = {}
    return [seen.setdefault(int(c), len(seen)) for c in labels]


def two_groups_of_three() -> np.ndarray:
    """L for six clients in two groups {0, 1, 2} and {3, 4, 5}: 0.2 inside, 3.0 across."""
    group = np.array([0, 0, 0, 1, 1, 1])
    return np.where(group[:, None] == group[None, :], 0.2, 3.0)


def test_init_groups_within_lambda_and_drops_groups_of_at_most_t():
    m = method(two_groups_of_three(), [0], size_threshold=2)
    assert canon(m.group_clients()) == [0, 0, 0, 1, 1, 1]
    m = method(two_groups_of_three(), [0], size_threshold=3)  # groups of exactly t are dropped
    assert m.group_clients().tolist() == [0] * 6 and m._metrics["srfca_dropped"] == 2
    losses = two_groups_of_three()
    losses[5] = np.nan  # client 5's own model diverged: it joins its nearest kept group by its column
    losses[[3, 4], 5] = 0.2
    m = method(losses, [0], size_threshold=1)
    assert canon(m.group_clients()) == [0, 0, 0, 1, 1, 1]


def test_recluster_moves_clients_drops_small_clusters_and_merges_close_ones():
    losses = two_groups_of_three()
    # cluster 0 holds clients 0-2 and 3, cluster 1 holds 4 and 5; the cluster models fit the groups
    m = method(losses, [0, 0, 0, 0, 1, 1], size_threshold=2)
    on_clients = np.array([[0.1, 0.1, 0.1, 3.0, 3.0, 3.0], [3.0, 3.0, 3.0, 0.1, 0.1, 0.1]])
    m.recluster_and_merge(on_clients)
    assert canon(m.clusters) == [0, 0, 0, 1, 1, 1]  # client 3 moved
    assert m.centers.shape[0] == 2 and m._metrics["srfca_merged"] == 0
    # three clusters, one of a single client (dropped: under t = 2), two whose models are close (merged)
    m = method(losses, [0, 0, 0, 1, 1, 2], size_threshold=2, lam=1.0)
    on_clients = np.array([[0.1, 0.1, 0.1, 3.0, 3.0, 3.0], [3.0, 3.0, 3.0, 0.1, 0.2, 0.1],
                           [2.9, 2.9, 2.9, 0.2, 0.1, 0.5]])
    m.recluster_and_merge(on_clients)
    assert canon(m.clusters) == [0, 0, 0, 1, 1, 1]
    assert m._metrics["srfca_dropped"] + m._metrics["srfca_merged"] == 1
    m = method(losses, [0, 0, 0, 1, 1, 1], size_threshold=2, lam=5.0)  # a λ above every distance: one cluster
    m.recluster_and_merge(np.array([[0.1, 0.1, 0.1, 3.0, 3.0, 3.0], [3.0, 3.0, 3.0, 0.1, 0.1, 0.1]]))
    assert m.clusters.tolist() == [0] * 6 and m.centers.shape[0] == 1


def test_the_blocks_cut_the_rounds_evenly():
    m = method(two_groups_of_three(), [0], size_threshold=2)
    for rounds, steps, starts in ((12, 2, {6}), (10, 3, {3, 7}), (2, 5, {1}), (5, 1, set())):
        m.ctx.training = SimpleNamespace(rounds=rounds)
        m.hp.refine_steps = steps
        assert m.block_starts() == starts


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


def test_the_start_in_blocks_of_clients_gives_the_same_losses_and_traffic(tmp_path, monkeypatch):
    """Past START_BLOCK_BYTES of models the start trains and scores a block of clients at a time
    (#70): every client's model still scored on every client's data, into its own row of L, and
    the same bytes counted."""
    import cflpipe.methods.srfca as srfca

    seen = []
    grouped = SRFCA.group_clients
    monkeypatch.setattr(SRFCA, "group_clients", lambda self: (seen.append(self.local_losses.copy()), grouped(self))[1])

    def run(block_bytes, name):
        monkeypatch.setattr(srfca, "START_BLOCK_BYTES", block_bytes)
        spec = parse_spec({"seeds": [0], "results_dir": str(tmp_path / name), "data_dir": str(tmp_path / "d"),
                           "training": {"model": "mlp", "rounds": 2, "clients_per_round": 4, "local_steps": 3,
                                        "batch_size": 16, "lr": 0.05, "eval_every": 2, "device": "cpu",
                                        "trainer": "sequential"},
                           "scenarios": {"s": {"dataset": "digits", "clients": 7, "pool": "train",
                                               "partition": [{"kind": "iid"}, {"kind": "label_swap", "groups": 2}]}},
                           "methods": {"srfca": {"init_steps": 5}}})
        return pd.read_parquet(train_run(spec, "s", "srfca", 0, progress=False).run_dir / "rounds.parquet")

    whole, blocks = run(srfca.START_BLOCK_BYTES, "whole"), run(1, "blocks")  # one block; blocks of one client
    assert len(seen) == 2 and not np.isnan(seen[0]).any()
    assert not np.allclose(seen[0], seen[0].T)  # L[i, j] is not L[j, i]: a row mixed up would show
    np.testing.assert_allclose(seen[1], seen[0], rtol=1e-6)
    assert whole[["bytes_down", "bytes_up"]].equals(blocks[["bytes_down", "bytes_up"]])


def test_the_start_groups_from_blocks_of_distance_rows_as_from_the_whole_matrix(monkeypatch):
    """group_clients reads d a block of DISTANCE_ROWS at a time (#70): λ, the groups and the rest's
    nearest group are those of the whole matrix, NaN rows and columns included."""
    import cflpipe.methods.srfca as srfca

    rng = np.random.default_rng(3)
    group = rng.integers(0, 4, 300)
    losses = np.where(group[:, None] == group[None, :], 0.5, 2.0) + rng.random((300, 300))
    losses[[7, 150]] = np.nan  # two clients whose own models diverged
    found = []
    for rows in (300, 64, 7):
        monkeypatch.setattr(srfca, "DISTANCE_ROWS", rows)
        m = method(losses, [0], size_threshold=2, lam=1.0)
        m.hp.threshold = None
        found.append((m.group_clients().tolist(), m.lam))
    assert found[0] == found[1] == found[2]
    d = (losses + losses.T) / 2
    assert found[0][1] == whole_matrix_lambda(d, 0.25)
    assert found[0][0] == whole_matrix_groups(d, found[0][1], size_threshold=2)
    assert adjusted_rand_score(group, found[0][0]) > 0.9  # the groups, but for the thresholded graph's fringe


def whole_matrix_lambda(d: np.ndarray, fraction: float) -> float:
    """λ as the code first computed it: every upper pair, sorted."""
    pairs = d[np.triu_indices(len(d), k=1)]
    pairs = np.sort(pairs[~np.isnan(pairs)])
    return float(pairs[min(int(np.ceil(fraction * len(pairs))), len(pairs) - 1)])


def whole_matrix_groups(d: np.ndarray, lam: float, size_threshold: int) -> list[int]:
    """The start's groups as the code first made them, from the whole distance matrix."""
    with np.errstate(invalid="ignore"):
        labels = correlation_clusters(d <= lam, np.random.default_rng(0))
    sizes = np.bincount(labels)
    kept = np.flatnonzero(sizes > size_threshold)
    assignment, inside = np.searchsorted(kept, labels), np.isin(labels, kept)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        to_groups = np.stack([np.nanmean(np.where(inside & (assignment == g), d, np.nan), axis=1)
                              for g in range(len(kept))], axis=1)
    rest = np.where(np.isnan(to_groups), np.inf, to_groups).argmin(axis=1)
    rest[~np.isfinite(np.nanmin(np.where(np.isnan(to_groups), np.inf, to_groups), axis=1))] = 0
    return np.where(inside, assignment, rest).tolist()
