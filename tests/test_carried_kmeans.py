"""Lloyd's k-means carried from round to round (clustering/carried.py, K-means CFL's
`kmeans_start: last`): the partition a full Lloyd run from the last round's clusters gives, reading
only the rows a round changed and those near a boundary."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cflpipe.clustering import kmeans
from cflpipe.clustering.carried import CarriedKMeans
from cflpipe.fl.params import cluster_average


def rounds_of_moves(n=300, p=40, k=4, spread=1.5, step=0.8, rounds=25, movers=30, common=0.0, seed=0):
    """A table of rows around k centres (plus a common part), then rounds in which some rows move."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(k, p))
    truth = rng.integers(k, size=n)
    table = torch.tensor(common + centres[truth] + rng.normal(size=(n, p)) * spread, dtype=torch.float32)
    moves = []
    for _ in range(rounds):
        rows = np.sort(rng.choice(n, movers, replace=False))
        moves.append((rows, torch.tensor(rng.normal(size=(movers, p)) * step, dtype=torch.float32)))
    return table, moves


def lloyd_from_last(table, labels, k):
    """The reference: one Lloyd run over every row from the last clusters' means in today's rows."""
    start, _ = cluster_average(table, torch.from_numpy(labels), torch.ones(len(table)), k)
    return kmeans(table, k, init=start).labels


@pytest.mark.parametrize("common", [0.0, 1000.0])
def test_carried_kmeans_gives_the_partition_of_lloyd_from_the_last_clusters(common):
    """Round after round the carried state's labels are those of a Lloyd run over the whole table
    started from the means of the last round's clusters, and its means those clusters' means, on
    noisy clusters whose boundaries rows cross (and with a common part 1000× the differences, as
    models descended from one global model have). At every round's fixed point each row is at least
    3e-4 (relative) nearer its own centre than any other, far past float32 rounding: the two code
    paths agree on any CPU."""
    table, moves = rounds_of_moves(common=common)
    k = 4
    labels = kmeans(table, k, seed=0).labels
    carried = CarriedKMeans.start(table, np.arange(len(table)), labels, k)
    crossings = 0
    for rows, step in moves:
        before = table[rows].clone()
        table[rows] += step
        reference = lloyd_from_last(table, labels, k)
        got = carried.update(table, rows, before)
        assert np.array_equal(got, reference)
        means, _ = cluster_average(table, torch.from_numpy(reference), torch.ones(len(table)), k)
        torch.testing.assert_close(carried.means().float(), means, rtol=1e-5, atol=1e-4 + 1e-6 * common)
        crossings += int((reference != labels).sum())
        labels = reference
    assert crossings > 0  # rows did change clusters: the bounds were put to work


def test_carried_kmeans_reads_only_the_moved_rows_where_no_boundary_is_near(monkeypatch):
    """Well-separated clusters and small moves: each round reads the moved rows and nothing else."""
    table, moves = rounds_of_moves(n=400, spread=0.05, step=0.01, movers=20, rounds=5)
    read = []
    real = CarriedKMeans._exact

    def counting(self, table, rows):
        read.append(len(rows))
        return real(self, table, rows)

    labels = kmeans(table, 4, seed=0).labels
    carried = CarriedKMeans.start(table, np.arange(len(table)), labels, 4)
    monkeypatch.setattr(CarriedKMeans, "_exact", counting)
    for rows, step in moves:
        before = table[rows].clone()
        table[rows] += step
        carried.update(table, rows, before)
    assert read == [20] * 5


def test_carried_kmeans_takes_in_rows_seen_for_the_first_time_and_survives_a_state_round_trip():
    """Rows not clustered yet (−1) join their nearest cluster when first changed; a state written
    and read back continues exactly as the one kept in memory."""
    table, moves = rounds_of_moves(n=200, rounds=6, movers=40)
    present = np.arange(100)  # the other hundred have not uploaded yet
    labels = kmeans(table[:100], 4, seed=0).labels
    carried = CarriedKMeans.start(table, present, labels, 4)
    assert (carried.labels[100:] == -1).all()
    copy = CarriedKMeans.from_state({name: value.clone() for name, value in carried.state().items()})
    for rows, step in moves:
        before = table[rows].clone()
        table[rows] += step
        got, again = carried.update(table, rows, before), copy.update(table, rows, before)
        assert np.array_equal(got, again)
        assert torch.equal(carried.sums, copy.sums) and torch.equal(carried.upper, copy.upper)
    joined = np.unique(np.concatenate([rows for rows, _ in moves]))
    assert (got[joined] >= 0).all() and (got[np.setdiff1d(np.arange(100, 200), joined)] == -1).all()
    seen = got >= 0
    assert np.array_equal(got[seen], lloyd_from_last(table[seen], got[seen], 4))  # a Lloyd fixed point
    assert int(carried.counts.sum()) == int(seen.sum())



def test_kmeans_cfl_carried_from_the_last_round_passes_the_conformance_checks(registry_copy, tmp_path):
    """K-means CFL with `kmeans_start: last` (its carried state checkpointed, uploads received as
    copies) passes every conformance check as a plugin subclass that turns it on."""
    from cflpipe.methods.kmeans_cfl import KMeansCFL
    from cflpipe.methods.kmeans_cfl_params import KMeansCFLParams
    from cflpipe.registry import register
    from cflpipe.testing import check_method

    def settings(cls, params):
        return {**KMeansCFL.check_hyperparams(params), "kmeans_start": "last"}

    Carried = type("Carried", (KMeansCFL,), {"__module__": __name__, "__qualname__": "Carried",
                                             "__doc__": "K-means CFL, carried.", "check_hyperparams": classmethod(settings)})
    register("kmeans_cfl_carried", KMeansCFLParams)(Carried)
    check_method("kmeans_cfl_carried", tmp_path)


def true_bounds(carried, table):
    """Each clustered row's distance to its own centre and to the nearest other (float64)."""
    d = torch.cdist(table.double(), carried.centers)
    rows = (carried.labels >= 0).nonzero().squeeze(1)
    own = d[rows, carried.labels[rows]]
    d[rows, carried.labels[rows]] = float("inf")
    return rows, own, d[rows].min(dim=1).values


def test_carried_kmeans_bounds_hold_when_its_iterations_run_out():
    """Stopped by max_iter, the state's bounds still bound the distances to its centres (the last
    move's), and later rounds end where Lloyd from the last clusters does."""
    table, moves = rounds_of_moves(n=200, rounds=12, movers=40, step=1.5)
    labels = kmeans(table, 4, seed=0).labels
    carried = CarriedKMeans.start(table, np.arange(len(table)), labels, 4)
    for i, (rows, step) in enumerate(moves):
        before = table[rows].clone()
        table[rows] += step
        got = carried.update(table, rows, before, max_iter=1 if i < 8 else 100)
        index, own, other = true_bounds(carried, table)
        assert (carried.upper[index] >= own * (1 - 1e-6)).all() and (carried.lower[index] <= other * (1 + 1e-6)).all()
        if i >= 8:
            assert np.array_equal(got, lloyd_from_last(table, labels, 4))
        labels = got


def test_carried_kmeans_tells_apart_clusters_far_smaller_than_the_models_common_part():
    """Models descended from one global model: a common part 1000, clusters 0.01 apart, float32
    rows. The carried labels are those of Lloyd from the last clusters in float64."""
    rng = np.random.default_rng(3)
    p, k = 2000, 3
    offsets = 0.01 * rng.normal(size=(k, p))
    truth = np.repeat(np.arange(k), 30)
    exact = 1000.0 + offsets[truth] + 0.006 * rng.normal(size=(len(truth), p))
    table = torch.tensor(exact, dtype=torch.float32)
    labels = kmeans(table.double(), k, seed=0).labels
    carried = CarriedKMeans.start(table, np.arange(len(truth)), labels, k)
    for _ in range(6):
        rows = np.sort(rng.choice(len(truth), 20, replace=False))
        before = table[rows].clone()
        exact[rows] += 0.004 * rng.normal(size=(20, p))
        table[rows] = torch.tensor(exact[rows], dtype=torch.float32)
        got = carried.update(table, rows, before)
        assert np.array_equal(got, lloyd_from_last(table.double(), labels, k))
        labels = got
        # the rows it read: their distances to within float32 products of the differences
        _, own, _ = true_bounds(carried, table)  # the rows as stored (float32), in float64
        torch.testing.assert_close(carried.upper[rows], own[rows], rtol=5e-5, atol=0)  # a float64 origin: 1.4e-4


def test_carried_kmeans_ties_go_to_the_lowest_cluster():
    """A row as far from two centres joins the lower-numbered cluster, as the k-means engine's."""
    table = torch.tensor([[0.0] * 3, [0.0] * 3, [1.0] * 3, [1.0] * 3, [0.5] * 3])
    carried = CarriedKMeans.start(table, np.arange(4), np.array([1, 1, 0, 0]), 2)  # cluster 0 at the ones
    assert carried.update(table, np.array([4]), None)[4] == 0
    carried = CarriedKMeans.start(table, np.arange(4), np.array([0, 0, 1, 1]), 2)
    assert carried.update(table, np.array([4]), None)[4] == 0
