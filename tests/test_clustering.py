"""cflpipe.clustering: the shared server-side clustering tools, on hand-made vectors."""

import numpy as np
import pytest
import torch
from sklearn.cluster import AgglomerativeClustering
from sklearn.metrics import adjusted_rand_score

from cflpipe.clustering import engine
from cflpipe.clustering import (
    as_matrix,
    canonical_labels,
    cfl_bipartition,
    cosine_similarity_matrix,
    dbscan_precomputed,
    decomposed_cosine_similarity,
    fcca_similarity,
    fit_pca,
    hierarchical_clusters,
    hopkins,
    js_divergence_matrix,
    kmeans,
    nearest_center,
    pairwise_sq_distances,
    principal_directions,
)

torch.set_num_threads(1)


def blobs(centers: torch.Tensor, per: int, noise: float, seed: int = 0) -> tuple[torch.Tensor, np.ndarray]:
    g = torch.Generator().manual_seed(seed)
    labels = np.repeat(np.arange(centers.shape[0]), per)
    x = centers[labels] + noise * torch.randn(len(labels), centers.shape[1], generator=g, dtype=centers.dtype)
    return x, labels


def planted_updates(groups: int, per: int, dim: int, common: float = 3.0, noise: float = 0.3, seed: int = 0):
    """Updates = a shared direction (every client learns the same generic features) + a
    group-specific direction + noise, like clients' first updates from one model."""
    g = torch.Generator().manual_seed(seed)
    shared = torch.randn(dim, generator=g, dtype=torch.float64)
    own = torch.randn(groups, dim, generator=g, dtype=torch.float64)
    labels = np.repeat(np.arange(groups), per)
    x = common * shared / shared.norm() + own[labels] / own[labels].norm(dim=1, keepdim=True)
    x = x + noise * torch.randn(len(labels), dim, generator=g, dtype=torch.float64) / dim ** 0.5
    return x, labels


# ---------------------------------------------------------------------------- basics


def test_canonical_labels_number_clusters_by_first_appearance():
    assert canonical_labels(np.array([7, 7, 2, 9, 2])).tolist() == [0, 0, 1, 2, 1]
    assert canonical_labels(np.array([3])).tolist() == [0]


def test_pairwise_sq_distances_and_nearest_center_match_brute_force():
    g = torch.Generator().manual_seed(1)
    x, c = torch.randn(30, 7, generator=g), torch.randn(4, 7, generator=g)
    brute = ((x[:, None, :].double() - c[None, :, :].double()) ** 2).sum(-1)
    assert torch.allclose(pairwise_sq_distances(x, c), brute, atol=1e-9)
    gaps = brute.sort(dim=1).values
    clear = (gaps[:, 1] - gaps[:, 0]) > 1e-6  # a near-tie may go either way between two sums
    assert clear.all()
    assert nearest_center(x, c).tolist() == brute.argmin(1).tolist()
    assert nearest_center(x.numpy(), c.numpy()).dtype == np.int64


def test_cosine_similarity_matrix():
    a = torch.tensor([[1.0, 0.0], [0.0, 2.0], [-3.0, 0.0], [0.0, 0.0]])
    s = cosine_similarity_matrix(a)
    assert s.shape == (4, 4) and s.dtype == torch.float64
    assert s[0, 2] == -1 and s[0, 1] == 0 and s[1, 1] == 1
    assert (s[3] == 0).all(), "a zero vector is similar to nothing"
    b = torch.tensor([[1.0, 1.0]])
    assert torch.allclose(cosine_similarity_matrix(a, b)[:3, 0], torch.tensor([2 ** -0.5, 2 ** -0.5, -(2 ** -0.5)],
                                                                           dtype=torch.float64))


# ---------------------------------------------------------------------------- k-means


def test_kmeans_recovers_planted_centers_and_is_deterministic():
    centers = torch.tensor([[0.0, 0.0, 0.0], [10.0, 0.0, 0.0], [0.0, 10.0, 0.0]], dtype=torch.float64)
    x, truth = blobs(centers, 20, 0.5)
    result = kmeans(x, 3, seed=0, n_init=20)
    assert adjusted_rand_score(truth, result.labels) == 1.0
    # Centers match the planted ones (up to the order of the clusters).
    for k in range(3):
        assert torch.cdist(centers[k:k + 1], result.centers).min() < 0.5
    assert result.inertia == pytest.approx(float(((x - result.centers[result.labels]) ** 2).sum()))
    again = kmeans(x, 3, seed=0, n_init=20)
    assert np.array_equal(again.labels, result.labels) and torch.equal(again.centers, result.centers)
    assert kmeans(x.float(), 3, seed=0).centers.dtype == torch.float32


def test_kmeans_keeps_the_restart_with_lowest_intra_cluster_distance():
    centers = torch.tensor([[0.0, 0.0], [6.0, 0.0], [0.0, 6.0], [6.0, 6.0]], dtype=torch.float64)
    x, _ = blobs(centers, 10, 1.5, seed=3)
    singles = [kmeans(x, 4, seed=s, n_init=1, init="random").inertia for s in range(20)]
    best = kmeans(x, 4, seed=np.random.default_rng(0), n_init=20, init="random").inertia
    assert best <= min(singles) + 1e-9 or best == pytest.approx(min(singles))
    assert best <= np.median(singles)


def test_restarts_ending_in_one_partition_are_ties_whatever_their_numbering(monkeypatch):
    # Two restarts find the same two groups under swapped numbers; the later one's inertia is
    # lower in the last bits (as when the last cluster's sum comes from the column sums). The
    # earlier numbering must win, or rounding picks it. A genuinely lower partition still wins.
    x = torch.tensor([[0.0, 0.0], [0.1, 0.0], [5.0, 5.0], [5.1, 5.0], [0.0, 0.1]], dtype=torch.float64)
    lloyd = engine._lloyd

    def numbered_twice(data, starts, max_iter, tol):
        found = lloyd(data, starts[:1], max_iter, tol)
        labels, centers, inertia, iterations = found[0]
        swapped = (1 - labels, centers.flip(0), inertia * (1 - 1e-15), iterations)
        return [found[0], swapped]

    first = kmeans(x, 2, seed=0, n_init=1, init="random")
    monkeypatch.setattr(engine, "_lloyd", numbered_twice)
    assert first.labels.tolist() in ([0, 0, 1, 1, 0], [1, 1, 0, 0, 1])
    assert kmeans(x, 2, seed=0, n_init=2, init="random").labels.tolist() == first.labels.tolist()

    def worse_then_better(data, starts, max_iter, tol):
        labels, centers, inertia, iterations = lloyd(data, starts[:1], max_iter, tol)[0]
        other = np.array([0, 1, 1, 1, 0])
        return [(labels, centers, inertia, iterations), (other, centers, inertia / 2, iterations)]

    monkeypatch.setattr(engine, "_lloyd", worse_then_better)
    assert kmeans(x, 2, seed=0, n_init=2, init="random").labels.tolist() == [0, 1, 1, 1, 0]


def test_a_nan_inertia_never_wins_a_restart_and_any_number_replaces_it():
    labels = np.array([0, 0, 1])
    nan, one, two = ((labels, None, value, 1) for value in (float("nan"), 1.0, 2.0))
    assert not engine._better(nan, two)
    assert engine._better(one, nan) and not engine._better(nan, nan)
    assert engine._better((np.array([0, 1, 1]), None, 1.0, 1), two)


def test_kmeans_from_given_centers_and_empty_clusters():
    x = torch.tensor([[0.0], [0.2], [5.0], [5.2]], dtype=torch.float64)
    result = kmeans(x, 2, init=torch.tensor([[0.0], [5.0]], dtype=torch.float64))
    assert result.labels.tolist() == [0, 0, 1, 1]
    assert torch.allclose(result.centers, torch.tensor([[0.1], [5.1]], dtype=torch.float64))
    # A center nobody is near keeps its value instead of becoming NaN.
    far = kmeans(x, 3, init=torch.tensor([[0.0], [5.0], [100.0]], dtype=torch.float64))
    assert torch.isfinite(far.centers).all() and far.centers[2, 0] == 100.0
    with pytest.raises(ValueError):
        kmeans(x, 5)


def test_kmeans_stops_after_max_iter_lloyd_steps():
    # Hand-computed Lloyd steps from centers 0 and 1: {0} | {1, 2, 3, 10, 11} -> 0, 5.4;
    # {0, 1, 2} | {3, 10, 11} -> 1, 8; {0, 1, 2, 3} | {10, 11} -> 1.5, 10.5, then stable.
    x = torch.tensor([[0.0], [1.0], [2.0], [3.0], [10.0], [11.0]], dtype=torch.float64)
    start = torch.tensor([[0.0], [1.0]], dtype=torch.float64)
    steps = {n: kmeans(x, 2, init=start, max_iter=n) for n in (1, 2, 100)}
    assert steps[1].centers.flatten().tolist() == pytest.approx([0.0, 5.4])
    assert steps[1].iterations == 1 and steps[1].labels.tolist() == [0, 0, 0, 1, 1, 1]
    assert steps[2].centers.flatten().tolist() == pytest.approx([1.0, 8.0]) and steps[2].iterations == 2
    assert steps[100].centers.flatten().tolist() == pytest.approx([1.5, 10.5])
    assert steps[100].labels.tolist() == [0, 0, 0, 0, 1, 1] and steps[100].inertia == pytest.approx(5.5)


def _plain_lloyd(x: np.ndarray, start: np.ndarray, max_iter: int, tol: float):
    """Lloyd's algorithm written out on full float64 distances, as a textbook gives it."""
    centers, labels = start.copy(), None
    for iteration in range(1, max_iter + 1):
        assigned = ((x[:, None, :] - centers[None]) ** 2).sum(axis=2).argmin(axis=1)
        stable = labels is not None and np.array_equal(assigned, labels)
        labels = assigned
        means = np.array([x[labels == j].mean(axis=0) if (labels == j).any() else centers[j]
                          for j in range(len(centers))])
        shift = ((means - centers) ** 2).sum()
        centers = means
        if stable or (tol > 0 and shift <= tol):
            break
    d = ((x[:, None, :] - centers[None]) ** 2).sum(axis=2)
    final = d.argmin(axis=1)
    return final, centers, d[np.arange(len(x)), final].sum(), iteration


def _assert_restarts_run_as_plain_lloyd(x: np.ndarray, k: int, max_iter: int, tol: float, seeds: range):
    """kmeans with one restart per seed against _plain_lloyd from the same initial rows."""
    for seed in seeds:
        rows = np.sort(np.random.default_rng(seed).choice(len(x), size=k, replace=False))
        labels, centers, inertia, iterations = _plain_lloyd(x, x[rows], max_iter, tol)
        result = kmeans(torch.from_numpy(x), k, seed=seed, n_init=1, max_iter=max_iter, tol=tol)
        assert result.labels.tolist() == labels.tolist()
        assert np.allclose(result.centers.numpy(), centers, rtol=0, atol=1e-10)
        assert result.inertia == pytest.approx(inertia, rel=1e-9, abs=1e-9) and result.inertia >= 0.0
        assert result.iterations == iterations


@pytest.mark.parametrize("k, max_iter, tol", [(1, 100, 0.0), (2, 100, 0.0), (3, 100, 0.0), (5, 100, 0.0),
                                              (3, 2, 0.0), (4, 100, 0.5), (12, 100, 0.0)])
def test_kmeans_runs_as_plain_lloyd_does(k, max_iter, tol):
    """kmeans takes a step's means and the next assignment in one pass, with k − 1 products per
    row (distances relative to a run's first center), the last cluster's sum as the rest of the
    total and a converged run's inertia as Σ‖x‖² − Σ n_k‖c_k‖²: each run must still end where
    Lloyd's algorithm written out ends, from the same initial rows: labels, centers, inertia and
    iteration count, for every restart (n_init = 1 per seed), stopped by convergence, max_iter or
    tol, with k = 1 and k = n among them."""
    rng = np.random.default_rng(7)
    x = np.concatenate([rng.normal(loc, 1.0, size=(4, 6)) for loc in (0.0, 3.0, -3.0)])
    _assert_restarts_run_as_plain_lloyd(x, k, max_iter, tol, range(6))


def _starts(x: np.ndarray, k: int, seeds: range) -> np.ndarray:
    """Each seed's Forgy rows, as kmeans draws them for one restart."""
    return np.stack([x[np.sort(np.random.default_rng(seed).choice(len(x), size=k, replace=False))] for seed in seeds])


@pytest.mark.parametrize("k, max_iter, tol", [(2, 100, 0.0), (3, 100, 0.0), (5, 100, 0.0), (4, 4, 0.0),
                                              (3, 100, 1e-3)])
def test_kmeans_steps_that_read_only_undecided_rows_run_as_plain_lloyd_does(monkeypatch, k, max_iter, tol):
    """Once few labels change, a step moves the sums by the rows that changed cluster and
    computes again only the rows whose bounds leave their nearest center open (in any restart).
    On overlapping blobs (many steps, few changes each) every restart of a group advancing
    together must still end as Lloyd's algorithm written out does, and such steps must really
    have run."""

    reads = {"changed_sums": 0, "rows_relative": 0}
    for name in reads:
        original = getattr(engine._Centered, name)

        def spy(self, rows, *rest, _original=original, _name=name):
            reads[_name] += 1
            assert len(rows) <= engine._BOUNDED_SHARE * self.n
            return _original(self, rows, *rest)
        monkeypatch.setattr(engine._Centered, name, spy)
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.normal(loc, 1.5, size=(100, 8)) for loc in (0.0, 1.0, 2.0, 3.0)])
    _assert_restarts_run_as_plain_lloyd(x, k, max_iter, tol, range(2))
    data = engine._Centered(torch.from_numpy(x))
    starts = _starts(x, k, range(8))
    together = engine._lloyd(data, torch.from_numpy(starts) - data.mean, max_iter, tol)
    for start, (labels, centers, inertia, iterations) in zip(starts, together):
        plain = _plain_lloyd(x, start, max_iter, tol)
        assert labels.tolist() == plain[0].tolist() and iterations == plain[3]
        assert np.allclose((centers + data.mean).numpy(), plain[1], rtol=0, atol=1e-10)
        assert inertia == pytest.approx(plain[2], rel=1e-9)
    assert reads["changed_sums"] > 0 and reads["rows_relative"] > 0


def test_kmeans_ties_between_equal_centers_go_to_the_lowest_index():
    """Forgy may draw two equal rows (clients that never trained hold one model): rows nearest to
    both go to the first of them, as in Lloyd's algorithm, however the products round."""
    rng = np.random.default_rng(0)
    for k in (3, 6, 10):
        for p in (5, 33, 100):
            x = rng.normal(size=(60, p))
            x[1] = x[0]
            start = x[list(range(2, k)) + [0, 1]]  # the equal pair last
            for max_iter in (1, 100):
                labels, centers, inertia, iterations = _plain_lloyd(x, start, max_iter, 0.0)
                result = kmeans(torch.from_numpy(x), k, init=torch.from_numpy(start), max_iter=max_iter)
                assert result.labels.tolist() == labels.tolist() and result.iterations == iterations


def test_kmeans_gives_the_same_labels_with_full_passes_only(monkeypatch):
    """float32 models from a common start, restarts advancing together as kmeans runs them: the
    rows computed again alone and the bounds' margin must leave every restart where full passes
    take it. Rows computed alone round otherwise than in a pass, so a row within rounding of a
    tie may send one restart elsewhere on some CPU: one of 12 may differ; bounds that let a row
    change cluster unseen send most of them elsewhere."""

    calls = []
    original = engine._Centered.rows_relative
    monkeypatch.setattr(engine._Centered, "rows_relative",
                        lambda self, rows, centers: calls.append(len(rows)) or original(self, rows, centers))
    g = torch.Generator().manual_seed(4)
    p = 32
    directions = 0.01 * torch.randn(4, p, generator=g)
    x = (5.0 + directions[torch.arange(400) % 4] + 0.05 * torch.randn(400, p, generator=g)).float()
    data = engine._Centered(x)
    starts = torch.from_numpy(_starts(x.numpy(), 4, range(12))) - data.mean
    bounded = engine._lloyd(data, starts, 100, 0.0)
    assert len(calls) >= 5  # rows were computed again alone, in several steps
    monkeypatch.setattr(engine, "_BOUNDED_SHARE", 0.0)
    full = engine._lloyd(engine._Centered(x), starts, 100, 0.0)
    same = [np.array_equal(labels, full_labels) and iterations == full_iterations
            and torch.allclose(centers, full_centers, rtol=0, atol=1e-5) and inertia == pytest.approx(full_inertia, rel=1e-5)
            for (labels, centers, inertia, iterations), (full_labels, full_centers, full_inertia, full_iterations)
            in zip(bounded, full)]
    assert sum(same) >= 11, same


def test_a_lloyd_step_as_the_first_pass_gives_the_clusters_means(monkeypatch):
    """The first pass over x also takes its column sums, which a step needs for its last cluster:
    a step that is the first pass must not take them in a pass nested in its own (both would
    write the one pass buffer)."""

    monkeypatch.setattr(engine, "_CHUNK_ELEMENTS", 50 * 64)  # blocks of 64 columns: 5 of them
    g = torch.Generator().manual_seed(2)
    x = torch.randn(50, 300, generator=g, dtype=torch.float64)
    labels = torch.randint(0, 3, (2, 50), generator=g)
    counts = torch.stack([torch.bincount(run, minlength=3) for run in labels]).to(torch.float64)
    data = engine._Centered(x)
    centers, relative, _ = data.lloyd_step(labels, counts, torch.zeros(2, 3, 300, dtype=torch.float64))
    centered = x - x.mean(dim=0)
    means = torch.stack([torch.stack([centered[run == j].mean(dim=0) for j in range(3)]) for run in labels])
    assert torch.allclose(centers, means, rtol=0, atol=1e-12)
    distances = ((centered[:, None, None, :] - means[None]) ** 2).sum(dim=3)  # (rows × runs × k)
    assert torch.allclose(relative, distances[..., 1:] - distances[..., :1], rtol=0, atol=1e-9)


def test_kmeans_plus_plus():
    centers = torch.tensor([[0.0, 0.0], [20.0, 0.0]], dtype=torch.float64)
    x, truth = blobs(centers, 15, 1.0)
    assert adjusted_rand_score(truth, kmeans(x, 2, seed=4, init="k-means++", n_init=3).labels) == 1.0


# ---------------------------------------------------------------------------- CFL bipartition


def test_cfl_bipartition_separates_opposite_directions():
    g = torch.Generator().manual_seed(0)
    u = torch.randn(50, generator=g, dtype=torch.float64)
    updates = torch.cat([u + 0.3 * torch.randn(4, 50, generator=g, dtype=torch.float64),
                         -u + 0.3 * torch.randn(3, 50, generator=g, dtype=torch.float64)])
    labels = cfl_bipartition(cosine_similarity_matrix(updates))
    assert labels.tolist() == [0, 0, 0, 0, 1, 1, 1]
    assert cfl_bipartition(np.ones((1, 1))).tolist() == [0]


def test_cfl_bipartition_equals_reference_agglomerative_on_negative_similarity():
    # The reference code: AgglomerativeClustering(linkage="complete", precomputed) on −S.
    rng = np.random.default_rng(5)
    for trial in range(5):
        x = rng.normal(size=(12, 30)) + np.repeat(rng.normal(size=(3, 30)), 4, axis=0)
        s = cosine_similarity_matrix(torch.from_numpy(x)).numpy()
        ours = cfl_bipartition(s)
        reference = AgglomerativeClustering(n_clusters=2, metric="precomputed", linkage="complete").fit(-s).labels_
        assert adjusted_rand_score(reference, ours) == 1.0, trial


# ---------------------------------------------------------------------------- hierarchical


def test_hierarchical_clusters_by_count_and_by_threshold():
    centers = torch.tensor([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]], dtype=torch.float64)
    x, truth = blobs(centers, 6, 0.3)
    assert adjusted_rand_score(truth, hierarchical_clusters(x, n_clusters=3)) == 1.0
    assert adjusted_rand_score(truth, hierarchical_clusters(x, distance_threshold=5.0)) == 1.0
    assert len(set(hierarchical_clusters(x, distance_threshold=1e6).tolist())) == 1
    assert len(set(hierarchical_clusters(x, distance_threshold=1e-9).tolist())) == len(x)
    for linkage in ("average", "complete", "single"):
        labels = hierarchical_clusters(x, n_clusters=3, linkage=linkage, metric="cityblock")
        assert adjusted_rand_score(truth, labels) == 1.0
    # Same partition as scikit-learn's ward clustering.
    rng = np.random.default_rng(2)
    y = rng.normal(size=(25, 6))
    sk = AgglomerativeClustering(n_clusters=4, linkage="ward").fit(y).labels_
    assert adjusted_rand_score(sk, hierarchical_clusters(torch.from_numpy(y), n_clusters=4)) == 1.0
    with pytest.raises(ValueError):
        hierarchical_clusters(x)
    with pytest.raises(ValueError):
        hierarchical_clusters(x, n_clusters=2, metric="cosine")  # ward needs euclidean


def test_hierarchical_cosine_metric_groups_directions():
    x = torch.tensor([[1.0, 0.0], [5.0, 0.1], [0.0, 1.0], [0.1, 7.0]])
    assert hierarchical_clusters(x, n_clusters=2, linkage="average", metric="cosine").tolist() == [0, 0, 1, 1]


# ---------------------------------------------------------------------------- FedGroup / PCA


def test_principal_directions_are_the_top_right_singular_vectors():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(8, 40, generator=g, dtype=torch.float64)
    v = principal_directions(w, 3)
    assert v.shape == (3, 40)
    assert torch.allclose(v @ v.T, torch.eye(3, dtype=torch.float64), atol=1e-8)
    _, _, vh = torch.linalg.svd(w, full_matrices=False)
    assert torch.allclose((v * vh[:3]).sum(1).abs(), torch.ones(3, dtype=torch.float64), atol=1e-8)
    assert torch.equal(principal_directions(w, 3), v), "deterministic, signs included"
    # the sign convention: every direction's largest-magnitude client coefficient is positive
    coefficients = w @ v.T
    assert (coefficients.gather(0, coefficients.abs().argmax(0, keepdim=True)) > 0).all()
    # unit directions whatever the scale of the updates (singular values below 1 too)
    small = principal_directions(w * 1e-3, 3)
    assert torch.allclose(small @ small.T, torch.eye(3, dtype=torch.float64), atol=1e-8)
    assert torch.allclose(small, v, atol=1e-8)


def test_decomposed_cosine_similarity_separates_planted_groups():
    x, truth = planted_updates(groups=4, per=6, dim=500)
    # Raw cosine similarity is dominated by the shared direction...
    assert cosine_similarity_matrix(x).min() > 0.7
    dcs = decomposed_cosine_similarity(x, 4)
    assert dcs.shape == (24, 4)
    labels = kmeans(dcs, 4, seed=0, n_init=10, init="k-means++").labels
    assert adjusted_rand_score(truth, labels) == 1.0
    # ...while EDC (distances between rows) is small within and large across groups.
    edc = torch.cdist(dcs, dcs)
    same = torch.from_numpy(truth[:, None] == truth[None, :])
    assert edc[same].max() < edc[~same].min()
    # New updates are projected onto the decomposition of the old ones.
    directions = principal_directions(x, 4)
    assert torch.allclose(decomposed_cosine_similarity(x[:3], 4, directions=directions), dcs[:3])


def test_fit_pca_randomized_matches_exact_and_leaves_global_rng_alone():
    g = torch.Generator().manual_seed(0)
    basis = torch.linalg.qr(torch.randn(200, 5, generator=g, dtype=torch.float64))[0].T  # 5 × 200
    x = torch.randn(40, 5, generator=g, dtype=torch.float64) * torch.tensor([9.0, 7, 5, 3, 1], dtype=torch.float64)
    x = x @ basis + 3.0
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    fast = fit_pca(x, 3, seed=7)
    assert torch.equal(torch.random.get_rng_state(), before)
    exact = fit_pca(x, 3, method="exact")
    assert fast.components.shape == (3, 200)
    # The same subspace: projections of one onto the other are the identity (up to sign).
    overlap = fast.components @ exact.components.T
    assert torch.allclose(overlap.abs(), torch.eye(3, dtype=torch.float64), atol=1e-6)
    assert torch.allclose(fast.transform(x).abs(), exact.transform(x).abs(), atol=1e-5)
    assert torch.equal(fit_pca(x, 3, seed=7).components, fast.components)
    assert fit_pca(x, 100).components.shape == (40, 200)


def test_kmeans_float32_models_sharing_a_large_common_part():
    """Model vectors all descend from one global model: a common part 1000× their differences.
    In float32, ‖x‖² + ‖c‖² − 2·x·c would lose the differences entirely (‖x‖² ≈ 2·10¹⁰, float32
    keeps ~7 digits, the squared distances are ≈ 2); k-means works from the rows' mean instead."""
    g = torch.Generator().manual_seed(0)
    p = 20_000
    offsets = 0.01 * torch.randn(3, p, generator=g)
    truth = np.repeat([0, 1, 2], 10)
    x = (1000.0 + offsets[truth] + 0.001 * torch.randn(30, p, generator=g)).float()
    result = kmeans(x, 3, seed=0, n_init=5, init="k-means++")
    assert adjusted_rand_score(truth, result.labels) == 1.0
    assert result.centers.dtype == torch.float32
    exact = kmeans(x.double(), 3, seed=0, n_init=5, init="k-means++")
    assert adjusted_rand_score(exact.labels, result.labels) == 1.0
    assert result.inertia == pytest.approx(exact.inertia, rel=1e-3)
    assert nearest_center(x, result.centers).tolist() == result.labels.tolist()


def test_kmeans_gives_the_same_answer_in_any_chunking(monkeypatch):
    """Restarts advance together and x is read in chunks; neither may change the outcome: each
    restart must end where it would alone, with the same best run chosen."""

    centers = torch.tensor([[0.0, 0.0], [6.0, 0.0], [0.0, 6.0], [6.0, 6.0]], dtype=torch.float64)
    x, _ = blobs(centers, 10, 2.0, seed=5)
    together = kmeans(x, 4, seed=3, n_init=8)
    monkeypatch.setattr(engine, "_CENTER_ELEMENTS", 1)  # one restart at a time
    monkeypatch.setattr(engine, "_CHUNK_ELEMENTS", 1)  # one row per chunk
    alone = kmeans(x, 4, seed=3, n_init=8)
    assert np.array_equal(alone.labels, together.labels) and alone.iterations == together.iterations
    assert torch.allclose(alone.centers, together.centers) and alone.inertia == pytest.approx(together.inertia)
    singles = [kmeans(x, 4, seed=s, n_init=1) for s in range(8)]
    assert len({round(r.inertia, 6) for r in singles}) > 1  # the restarts really differ


def test_kmeans_on_half_precision_models_computes_in_float32():
    """fp16 sums over many clients overflow at 65,504; the work runs in float32 and the centers
    come back in the input's dtype."""
    centers = torch.tensor([[0.0, 0.0], [600.0, 0.0], [0.0, 600.0]], dtype=torch.float64)
    x, truth = blobs(centers, 400, 1.0, seed=2)  # 1,200 rows: a cluster's sum exceeds fp16's range
    half = kmeans(x.half(), 3, seed=0, init="k-means++")
    single = kmeans(x.half().float(), 3, seed=0, init="k-means++")
    assert adjusted_rand_score(truth, half.labels) == 1.0 and half.centers.dtype == torch.float16
    assert np.array_equal(half.labels, single.labels)
    assert torch.isfinite(half.centers).all() and half.inertia == pytest.approx(single.inertia)


def test_kmeans_takes_vectors_that_require_grad():
    """Model parameters flattened without detaching: the passes' buffer must not meet autograd."""
    from cflpipe.clustering import kmeans

    generator = torch.Generator().manual_seed(0)
    points = torch.cat([torch.randn(5, 8, generator=generator) + 4, torch.randn(5, 8, generator=generator) - 4])
    result = kmeans(points.clone().requires_grad_(True), 2, seed=0, n_init=2)
    assert sorted(np.bincount(result.labels).tolist()) == [5, 5]
    assert np.array_equal(result.labels, kmeans(points, 2, seed=0, n_init=2).labels)


# ---------------------------------------------------------------------------- edge cases callers meet


def test_integer_input_is_converted_to_float64():
    assert as_matrix(np.array([[1, 2], [3, 4]])).dtype == torch.float64
    assert nearest_center(np.array([[0, 0], [9, 9]]), np.array([[8, 8], [1, 1]])).tolist() == [1, 0]


def test_distances_and_nearest_centers_of_no_rows_are_empty():
    centers = torch.randn(3, 5, dtype=torch.float64)
    d = pairwise_sq_distances(torch.zeros(0, 5), centers)
    assert d.shape == (0, 3) and d.dtype == torch.float64
    labels = nearest_center(torch.zeros(0, 5), centers)
    assert labels.shape == (0,) and labels.dtype == np.int64


def test_cosine_similarity_stays_within_minus_one_and_one():
    # Normalizing in floating point leaves some rows' self-similarity at 1 + 2⁻⁵² (and −1 − 2⁻⁵²
    # against their negatives): 1 − s feeds square roots and distances downstream.
    a = torch.from_numpy(np.random.default_rng(0).normal(size=(200, 7)))
    s = cosine_similarity_matrix(torch.cat([a, -a]))
    assert s.max() == 1.0 and s.min() == -1.0


def test_kmeans_on_float64_input_keeps_float64_precision():
    # Means of 0.1 and 0.2, 5.0 and 5.3: float32 arithmetic would be off by about 1e-7.
    x = torch.tensor([[0.1], [0.2], [5.0], [5.3]], dtype=torch.float64)
    result = kmeans(x, 2, init=torch.tensor([[0.0], [5.0]], dtype=torch.float64))
    expected = torch.tensor([[(0.1 + 0.2) / 2], [(5.0 + 5.3) / 2]], dtype=torch.float64)
    assert torch.allclose(result.centers, expected, rtol=0, atol=1e-14)
    assert result.inertia == pytest.approx(2 * 0.05 ** 2 + 2 * 0.15 ** 2, rel=1e-12)


def test_kmeans_centers_on_the_mean_of_every_chunk_of_rows(monkeypatch):
    """Real model matrices span several chunks of rows: the mean that float32 products are taken
    from must be that of all of them, or the common part of the models comes back and cancels."""

    g = torch.Generator().manual_seed(0)
    p = 20_000
    offsets = 0.01 * torch.randn(3, p, generator=g)
    truth = np.repeat([0, 1, 2], 10)
    x = (1000.0 + offsets[truth] + 0.001 * torch.randn(30, p, generator=g)).float()
    monkeypatch.setattr(engine, "_CHUNK_ELEMENTS", 4 * p)  # 4 rows per chunk: 8 chunks
    result = kmeans(x, 3, seed=0, n_init=2, init="k-means++")
    assert adjusted_rand_score(truth, result.labels) == 1.0
    exact = kmeans(x.double(), 3, seed=0, n_init=2, init="k-means++")
    assert result.inertia == pytest.approx(exact.inertia, rel=1e-3)


def test_principal_directions_of_float32_updates_are_computed_in_float64():
    w = torch.randn(6, 50, generator=torch.Generator().manual_seed(2))
    v = principal_directions(w, 3)
    assert v.dtype == torch.float64 and torch.equal(v, principal_directions(w.double(), 3))


# ---------------------------------------------------------------------------- FedTSDP's tools


def test_hopkins_by_hand_on_four_points_with_every_row_sampled():
    """samples = n draws every row once (without replacement), so Σv is the sum of the rows'
    nearest-neighbour distances: 1, 1, 2, 4 (× 0.01) for 0, 1, 3, 7 (× 0.01). The totals stay below
    1, as for FedTSDP's probability outputs."""
    x = 0.01 * np.array([[0.0], [1.0], [3.0], [7.0]])
    u = 0.07 * np.random.default_rng(5).random((4, 1))  # the uniform draws in the bounding box [0, 0.07]
    z = np.abs(u - x.T).min(axis=1).sum()
    v = 0.01 * (1 + 1 + 2 + 4)
    assert hopkins(x, 4, seed=5) == pytest.approx(z / (z + v), rel=1e-12)
    assert hopkins(x.astype(np.float32), 4, seed=5) == hopkins(x.astype(np.float32).astype(np.float64), 4, seed=5)
    two = hopkins(np.array([[0.0, 0.0], [3.0, 4.0]]), 2, seed=0)  # two clients are enough
    assert 0.0 <= two <= 1.0


def test_js_divergence_takes_numpy_probabilities():
    p = torch.softmax(torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(1)), -1).double()
    assert np.array_equal(js_divergence_matrix(p.numpy()), js_divergence_matrix(p))


def test_dbscan_reads_the_matrix_as_distances_not_as_coordinates():
    # Clients 0 and 1 lie 1 apart (within eps); read as points in R³ the rows would be √2 apart.
    distances = np.array([[0.0, 1.0, 9.0], [1.0, 0.0, 9.0], [9.0, 9.0, 0.0]])
    assert dbscan_precomputed(distances, 1.2, 2).tolist() == [0, 0, -1]


# ---------------------------------------------------------------------------- FCCA's similarity


def test_fcca_similarity_equals_its_definition_on_short_vectors():
    """B_{y,i,j} = mean_s cos(first[i,y,s], second[j,y,s]), P = max(|B_{y,i,i}|, |B_{y,j,j}|),
    D = mean_y B·P, computed loop by loop; the reconstructions are short (norms about 0.1), so any
    normalization over the wrong axis or by a wrong floor shows."""
    g = torch.Generator().manual_seed(3)
    first = 0.05 * torch.randn(3, 2, 4, 5, generator=g, dtype=torch.float64)
    second = first + 0.05 * torch.randn(3, 2, 4, 5, generator=g, dtype=torch.float64)
    clients, labels, samples, _ = first.shape
    basic = torch.zeros(labels, clients, clients, dtype=torch.float64)
    for y in range(labels):
        for i in range(clients):
            for j in range(clients):
                basic[y, i, j] = torch.stack([torch.nn.functional.cosine_similarity(
                    first[i, y, s], second[j, y, s], dim=0) for s in range(samples)]).mean()
    expected = torch.zeros(clients, clients, dtype=torch.float64)
    for i in range(clients):
        for j in range(clients):
            expected[i, j] = sum(basic[y, i, j] * max(abs(basic[y, i, i]), abs(basic[y, j, j]))
                                 for y in range(labels)) / labels
    assert (basic.diagonal(dim1=1, dim2=2).abs() < 0.99).all()  # confidences below 1: P matters
    assert torch.allclose(fcca_similarity(first, second), expected, atol=1e-12)


@pytest.mark.filterwarnings("ignore:invalid value encountered in sqrt")  # scipy's, on those samples
def test_js_divergence_of_nearly_identical_outputs_is_about_zero():
    # scipy's square root of a sum that rounds below 0 is nan for about half of these samples.
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(10), size=50)
    q = p * (1 + 1e-9 * rng.normal(size=p.shape))
    q /= q.sum(axis=1, keepdims=True)
    assert js_divergence_matrix(np.stack([p, q]))[0, 1] < 1e-12
