"""The per-method clustering tools on top of the engine: cosine similarity matrices, CFL's
bipartition, hierarchical clustering (FL+HC, PACFL), FCCA's similarity, FedTSDP's Hopkins
statistic, JS divergences and precomputed DBSCAN, FedGroup's decomposed cosine and FedAC's
randomized PCA."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from cflpipe.clustering.engine import (Seed, _Centered, _row_slices, as_generator, as_matrix, canonical_labels,
                                      pairwise_sq_distances)


# ---------------------------------------------------------------------------- similarities


def cosine_similarity_matrix(a: torch.Tensor | np.ndarray, b: torch.Tensor | np.ndarray | None = None,
                             eps: float = 1e-12) -> torch.Tensor:
    """Cosine similarity of every row of a with every row of b (default b = a): one matmul of
    row-normalized matrices, in float64. Zero rows get similarity 0."""
    a = as_matrix(a).to(torch.float64)
    b = a if b is None else as_matrix(b).to(dtype=torch.float64, device=a.device)
    an = a / a.norm(dim=1, keepdim=True).clamp_min(eps)
    bn = an if b is a else b / b.norm(dim=1, keepdim=True).clamp_min(eps)
    return (an @ bn.T).clamp_(-1.0, 1.0)


FCCA_COSINES = ("sample", "batch", "mean")


def fcca_similarity(first: torch.Tensor, second: torch.Tensor, eps: float = 1e-12,
                    cosine: str = "sample") -> torch.Tensor:
    """FCCA's similarity D (seed paper 002, Sec. 3.3) from reconstructions of every client's
    latents: `first[i, y]` = c_i⁻¹(ε1; y) and `second[j, y]` = c_j⁻¹(ε2; y), each
    (clients × labels × samples × features), the same noise ε1 (ε2) for every client.

    B_{y,i,j} = the cosine of Eq. 4 between the two batches of reconstructions, read as
      "sample": the mean over samples of cosine(first[i, y, s], second[j, y, s]);
      "batch":  the cosine of the two batches flattened into one vector each;
      "mean":   the cosine of the two batches' means (the paper's argument for the UNKNOWN label,
                E aᵀb = E a · E b for independent noise, compares means);
    P_{y,i,j} = max(|B_{y,i,i}|, |B_{y,j,j}|)  (confidence: a label the client learned gives
    reconstructions that agree across noise draws); S = B ⊙ P; D = mean of S over labels.
    One (clients × samples·features) product per label; returns D (clients × clients), float64."""
    if first.shape != second.shape or first.ndim != 4:
        raise ValueError(f"fcca_similarity: expected two equal (clients × labels × samples × features) "
                         f"tensors, got {tuple(first.shape)} and {tuple(second.shape)}")
    if cosine not in FCCA_COSINES:
        raise ValueError(f"fcca_similarity: cosine must be one of {FCCA_COSINES}, got {cosine!r}")
    if cosine == "batch":
        first, second = first.flatten(2)[:, :, None], second.flatten(2)[:, :, None]
    elif cosine == "mean":
        first, second = first.mean(2, keepdim=True), second.mean(2, keepdim=True)
    clients, labels, samples, _ = first.shape
    a = first / first.norm(dim=-1, keepdim=True).clamp_min(eps)
    b = second / second.norm(dim=-1, keepdim=True).clamp_min(eps)
    # (labels × clients × samples·features) @ (labels × samples·features × clients)
    a = a.transpose(0, 1).reshape(labels, clients, -1)
    b = b.transpose(0, 1).reshape(labels, clients, -1)
    basic = torch.bmm(a, b.transpose(1, 2)).to(torch.float64) / samples
    confidence = basic.diagonal(dim1=1, dim2=2).abs()  # (labels × clients): |B_{y,i,i}|
    pair = torch.maximum(confidence[:, :, None], confidence[:, None, :])
    return (basic * pair).mean(dim=0)


def cfl_bipartition(similarity: torch.Tensor | np.ndarray) -> np.ndarray:
    """CFL's optimal bipartition (Sattler et al. 2021): agglomerative clustering with complete
    linkage on the dissimilarity −S, cut into 2 clusters (the reference code runs sklearn's
    AgglomerativeClustering(linkage="complete") on −S). scipy needs non-negative distances, so
    1 − S is used: complete linkage only compares distances, and x ↦ 1 + x is increasing, so the
    merge order and the partition are those of −S. Returns 0/1 labels (the first row in 0)."""
    from scipy.cluster import hierarchy
    from scipy.spatial.distance import squareform

    s = similarity.detach().cpu().numpy() if isinstance(similarity, torch.Tensor) else np.asarray(similarity)
    s = np.asarray(s, dtype=np.float64)
    n = s.shape[0]
    if s.shape != (n, n):
        raise ValueError(f"cfl_bipartition: similarity must be square, got {s.shape}")
    if n < 2:
        return np.zeros(n, dtype=np.int64)
    d = 1.0 - (s + s.T) / 2.0
    np.fill_diagonal(d, 0.0)
    z = hierarchy.linkage(squareform(np.clip(d, 0.0, None), checks=False), method="complete")
    return canonical_labels(hierarchy.fcluster(z, t=2, criterion="maxclust"))


def hierarchical_clusters(x: torch.Tensor | np.ndarray, *, n_clusters: int | None = None,
                          distance_threshold: float | None = None,
                          linkage: Literal["ward", "average", "complete", "single"] = "ward",
                          metric: Literal["euclidean", "cosine", "cityblock"] = "euclidean") -> np.ndarray:
    """Agglomerative clustering of the rows of x (scipy.cluster.hierarchy), cut either into
    `n_clusters` clusters or where the merge height exceeds `distance_threshold` (exactly one).

    The pairwise distances are computed in torch (one cdist / matmul in float64) and handed to
    scipy in condensed form; past LEAN_PAIRWISE_BYTES of rows, Euclidean distances are written
    straight into the condensed form block by block (`_condensed_euclidean`). Ward linkage
    requires the Euclidean metric. Labels are 0, 1, … in order of first appearance."""
    if (n_clusters is None) == (distance_threshold is None):
        raise ValueError("hierarchical_clusters: give exactly one of n_clusters and distance_threshold")
    x = as_matrix(x)
    n = x.shape[0]
    if n == 1:
        return np.zeros(1, dtype=np.int64)
    if linkage == "ward" and metric != "euclidean":
        raise ValueError("hierarchical_clusters: ward linkage needs the euclidean metric")
    if lean_pairwise(x, metric):
        return _linkage_labels(_condensed_euclidean(x), n, linkage, n_clusters, distance_threshold)
    x = x.to(torch.float64)
    if metric == "euclidean":
        d = pairwise_sq_distances(x, x).sqrt()
    elif metric == "cosine":
        d = 1.0 - cosine_similarity_matrix(x)
    elif metric == "cityblock":
        d = torch.cdist(x, x, p=1)
    else:
        raise ValueError(f"hierarchical_clusters: unknown metric {metric!r}")
    return cut_dendrogram(d.cpu().numpy(), linkage, n_clusters=n_clusters, distance_threshold=distance_threshold)


def cut_dendrogram(d: np.ndarray, linkage: str, *, n_clusters: int | None = None,
                   distance_threshold: float | None = None) -> np.ndarray:
    """Agglomerative clustering (scipy's `linkage` method) of a square distance matrix,
    symmetrized and clipped at 0, cut into `n_clusters` or where the merge height exceeds
    `distance_threshold` (exactly one); labels in order of first appearance."""
    from scipy.spatial.distance import squareform

    n = len(d)
    if n == 1:
        return np.zeros(1, dtype=np.int64)
    d = np.clip((d + d.T) / 2.0, 0.0, None)
    np.fill_diagonal(d, 0.0)
    return _linkage_labels(squareform(d, checks=False), n, linkage, n_clusters, distance_threshold)


# Above this many bytes of rows in float64, hierarchical_clusters' Euclidean distances are taken
# without a float64 copy of the rows or a square matrix: FL+HC's one clustering of every client's
# update at 10,000 clients of the mlp held 13.6 GB that way (#59). Below it the square float64
# path stays, so results at the sizes the tests and shipped specs use keep their bits.
LEAN_PAIRWISE_BYTES = 1 << 30
# The lean path's blocks: rows whose products go against every later row at once, and the later
# rows read at a time (bytes of float32 rows).
_LEAN_BLOCK_BYTES = 128 << 20
_LEAN_STEP_BYTES = 32 << 20


def lean_pairwise(x: torch.Tensor, metric: str = "euclidean") -> bool:
    """Whether hierarchical_clusters takes the rows' Euclidean distances block by block from their
    mean (`_condensed_euclidean`) rather than through a float64 copy: translation-invariant, so a
    caller may pass points that differ from its own by a common shift (FL+HC: models for updates)."""
    return metric == "euclidean" and x.numel() * 8 > LEAN_PAIRWISE_BYTES


def _condensed_euclidean(x: torch.Tensor) -> np.ndarray:
    """The condensed (scipy's upper-triangle order) Euclidean distances between the rows of x, in
    float64, with temporary memory of one block of rows: products of rows seen from their mean
    in x's precision (k-means' `_Centered`: model updates share little, so float32 products lose
    nothing that matters to a dendrogram), norms and distances in float64."""
    n, p = x.shape
    centered = _Centered(x)
    sq = centered.sq
    rows = max(1, _LEAN_STEP_BYTES // max(4 * p, 1))
    condensed = np.empty(n * (n - 1) // 2, dtype=np.float64)
    block = max(1, _LEAN_BLOCK_BYTES // max(4 * p, 1))
    for start in range(0, n - 1, block):
        stop = min(start + block, n - 1)
        mine = centered.rows_of(slice(start, stop))
        for later in range(start, n, rows):
            theirs = centered.rows_of(slice(later, later + rows))
            d2 = (sq[start:stop, None] + sq[None, later:later + rows]
                  - 2.0 * (mine @ theirs.T).to(torch.float64)).clamp_min_(0.0).sqrt_()
            d2 = d2.cpu().numpy()
            for i in range(start, stop):  # row i's distances to rows i + 1 … in one contiguous run
                first = max(later, i + 1)
                if first >= later + d2.shape[1]:
                    continue
                at = i * n - i * (i + 1) // 2 + (first - i - 1)
                condensed[at:at + later + d2.shape[1] - first] = d2[i - start, first - later:]
    return condensed


def _linkage_labels(condensed: np.ndarray, n: int, linkage: str, n_clusters: int | None,
                    distance_threshold: float | None) -> np.ndarray:
    from scipy.cluster import hierarchy

    z = hierarchy.linkage(condensed, method=linkage)
    if n_clusters is not None:
        labels = hierarchy.fcluster(z, t=min(int(n_clusters), n), criterion="maxclust")
    else:
        labels = hierarchy.fcluster(z, t=float(distance_threshold), criterion="distance")
    return canonical_labels(labels)


# ---------------------------------------------------------------------------- FedTSDP


def hopkins(points: torch.Tensor | np.ndarray, samples: int, *, seed: Seed = 0) -> float:
    """Hopkins statistic H = Σz / (Σz + Σv) of the rows of `points` (FedTSDP's Eq. 6, after
    Banerjee & Dave 2004): z are the distances from `samples` points drawn uniformly in the rows'
    bounding box to their nearest row, v the distances from `samples` rows drawn without
    replacement to their nearest other row (L2). About 0.5 for uniformly spread rows, towards 1
    for clustered ones, towards 0 for rows on a regular grid. No well-kept library computes it
    (pyclustertend is unmaintained and returns 1 − H)."""
    x = as_matrix(points).to(torch.float64)
    n = x.shape[0]
    if n < 2:
        raise ValueError(f"hopkins: needs at least 2 points, got {n}")
    if not 1 <= samples <= n:
        raise ValueError(f"hopkins: samples must lie in [1, {n}], got {samples}")
    rng = as_generator(seed)
    low, high = x.min(dim=0).values, x.max(dim=0).values
    uniform = low + (high - low) * torch.from_numpy(rng.random((samples, x.shape[1]))).to(x)
    chosen = torch.from_numpy(rng.choice(n, size=samples, replace=False)).to(x.device)
    z = pairwise_sq_distances(uniform, x).clamp_min(0).sqrt().min(dim=1).values
    to_rows = pairwise_sq_distances(x[chosen], x).clamp_min(0)
    to_rows[torch.arange(samples, device=x.device), chosen] = float("inf")  # not its own neighbour
    v = to_rows.sqrt().min(dim=1).values
    total = float(z.sum() + v.sum())
    return float(z.sum()) / total if total > 0 else 0.5  # all rows equal: no tendency either way


def js_divergence_matrix(probabilities: torch.Tensor | np.ndarray) -> np.ndarray:
    """(clients × clients) Jensen–Shannon divergence (natural log) between clients' predicted
    distributions, `probabilities` of shape (clients, samples, classes) with rows summing to 1:
    the mean over samples of each sample's divergence. That mean equals the divergence of the
    flattened (samples·classes) outputs scaled to sum to 1, so FedTSDP's "flattened" reading and the
    per-sample one agree. scipy's `jensenshannon` gives the distance, i.e. the square root."""
    from scipy.spatial.distance import jensenshannon

    p = probabilities.detach().cpu().numpy() if isinstance(probabilities, torch.Tensor) else np.asarray(probabilities)
    p = p.astype(np.float64)
    distance = jensenshannon(p[:, None], p[None, :], axis=-1)  # (clients, clients, samples)
    divergence = np.nan_to_num(distance, nan=0.0) ** 2
    out = divergence.mean(axis=-1)
    out = (out + out.T) / 2.0
    np.fill_diagonal(out, 0.0)
    return out


def dbscan_precomputed(distances: np.ndarray, eps: float, min_samples: int) -> np.ndarray:
    """DBSCAN (scikit-learn) on a precomputed (n × n) distance matrix; labels as scikit-learn's
    (−1 = noise), the clusters numbered 0, 1, … in order of first appearance."""
    from sklearn.cluster import DBSCAN

    labels = DBSCAN(eps=float(eps), min_samples=int(min_samples), metric="precomputed").fit_predict(
        np.asarray(distances, dtype=np.float64))
    out = np.full(len(labels), -1, dtype=np.int64)
    found = labels >= 0
    if found.any():
        out[found] = canonical_labels(labels[found])
    return out


# ---------------------------------------------------------------------------- decompositions


def principal_directions(updates: torch.Tensor | np.ndarray, k: int) -> torch.Tensor:
    """The top-k right singular vectors of the (clients × parameters) update matrix ΔW, i.e. the
    top-k left singular vectors of ΔWᵀ that FedGroup calls the decomposed update directions; (k × P).

    Computed exactly from the small (clients × clients) Gram matrix ΔW·ΔWᵀ (one matmul, one
    symmetric eigendecomposition) — the SVD of a short, very wide matrix. Signs are fixed so that
    the largest-magnitude client coefficient of every direction is positive (deterministic)."""
    w = as_matrix(updates).to(torch.float64)
    n = w.shape[0]
    k = min(k, n)
    gram = w @ w.T
    eigenvalues, eigenvectors = torch.linalg.eigh(gram)  # ascending
    order = torch.argsort(eigenvalues, descending=True)[:k]
    sigma = eigenvalues[order].clamp_min(0).sqrt()
    u = eigenvectors[:, order]  # (n × k): left singular vectors of ΔW
    flip = torch.sign(u.gather(0, u.abs().argmax(dim=0, keepdim=True)))
    u = u * torch.where(flip == 0, torch.ones_like(flip), flip)
    directions = (u.T @ w) / sigma.clamp_min(1e-300)[:, None]  # v_j = ΔWᵀ u_j / σ_j
    return directions


def decomposed_cosine_similarity(updates: torch.Tensor | np.ndarray, k: int,
                                 directions: torch.Tensor | None = None) -> torch.Tensor:
    """FedGroup's decomposed cosine similarity (Duan et al. 2021): the cosine of every client's
    update with each of the top-k singular directions of the update matrix, (clients × k).

    Euclidean distances between the rows of this matrix are FedGroup's EDC measure; FedGroup runs
    k-means on the rows. Pass `directions` (from `principal_directions`) to project new updates
    (a newcomer's) onto an existing decomposition."""
    w = as_matrix(updates).to(torch.float64)
    if directions is None:
        directions = principal_directions(w, k)
    return cosine_similarity_matrix(w, directions)


@dataclass(frozen=True)
class PCAProjection:
    """x ↦ (x − mean) @ componentsᵀ; components are orthonormal rows (D × P)."""

    mean: torch.Tensor
    components: torch.Tensor

    def transform(self, x: torch.Tensor | np.ndarray) -> torch.Tensor:
        x = as_matrix(x)
        if x.numel() * x.element_size() <= _TRANSFORM_WHOLE_BYTES:
            x = x.to(dtype=self.components.dtype, device=self.components.device)
            return (x - self.mean) @ self.components.T
        # Every client's model (FedAC's refit at 10,000 clients): blocks of rows, so that x − mean
        # is never a second (clients × parameters) matrix (#59).
        out = torch.empty(x.shape[0], self.components.shape[0], dtype=self.components.dtype,
                          device=self.components.device)
        for rows in _row_slices(*x.shape):
            block = x[rows].to(dtype=self.components.dtype, device=self.components.device)
            out[rows] = (block - self.mean) @ self.components.T
        return out


# PCAProjection.transform takes rows past this many bytes block by block (below it at once, as
# at the sizes the tests use).
_TRANSFORM_WHOLE_BYTES = 256 << 20


def fit_pca(x: torch.Tensor | np.ndarray, n_components: int, *, seed: Seed = 0,
            method: Literal["randomized", "exact"] = "randomized", n_iter: int = 4,
            center: bool = True) -> PCAProjection:
    """PCA of the rows of x with at most min(n_components, rows, features) components.

    "randomized" is torch.svd_lowrank (Halko et al.) with its random test matrix drawn from a
    private generator seeded by `seed`, so the result is deterministic without touching the
    global torch RNG; "exact" is a full thin SVD. Component signs are fixed (largest-magnitude
    loading positive). For FedAC's low-rank cosine (LrCos)."""
    x = as_matrix(x)
    n, p = x.shape
    q = min(int(n_components), n, p)
    mean = x.mean(dim=0) if center else torch.zeros(p, dtype=x.dtype, device=x.device)
    xc = x - mean
    if method == "exact" or q >= min(n, p):
        _, _, vh = torch.linalg.svd(xc, full_matrices=False)
        components = vh[:q]
    elif method == "randomized":
        state = int(as_generator(seed).integers(2**63 - 1))
        devices = [x.device] if x.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(state)
            _, _, v = torch.svd_lowrank(xc, q=min(q + 10, min(n, p)), niter=n_iter)
        components = v[:, :q].T
    else:
        raise ValueError(f"fit_pca: unknown method {method!r}")
    idx = components.abs().argmax(dim=1, keepdim=True)
    sign = torch.sign(components.gather(1, idx))
    components = components * torch.where(sign == 0, torch.ones_like(sign), sign)
    return PCAProjection(mean, components.contiguous())
