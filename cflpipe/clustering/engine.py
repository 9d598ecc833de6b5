"""The k-means engine and the matrix helpers every clustering tool shares (see the package's
docstring for the conventions: pure functions, explicit seeds, whole-matrix work)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

Seed = int | np.random.Generator | None


# ---------------------------------------------------------------------------- helpers


def as_matrix(x: torch.Tensor | np.ndarray) -> torch.Tensor:
    """A 2-D float tensor (numpy input is converted without copying where possible)."""
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(np.ascontiguousarray(x))
    if x.ndim != 2:
        raise ValueError(f"expected a (rows × features) matrix, got shape {tuple(x.shape)}")
    if not torch.is_floating_point(x):
        x = x.to(torch.float64)
    return x


def as_generator(seed: Seed) -> np.random.Generator:
    if isinstance(seed, np.random.Generator):
        return seed
    return np.random.default_rng(seed)


def canonical_labels(labels: np.ndarray) -> np.ndarray:
    """Relabel clusters 0, 1, … in order of first appearance (so equal partitions get equal labels)."""
    labels = np.asarray(labels)
    _, first = np.unique(labels, return_index=True)
    order = np.argsort(first, kind="stable")
    mapping = np.empty(len(first), dtype=np.int64)
    mapping[order] = np.arange(len(first))
    _, inverse = np.unique(labels, return_inverse=True)
    return mapping[inverse.reshape(-1)].astype(np.int64)


def pairwise_sq_distances(x: torch.Tensor, y: torch.Tensor, x_sq_norms: torch.Tensor | None = None
                          ) -> torch.Tensor:
    """Squared Euclidean distances between the rows of x and of y, (n × k), clamped at 0.

    Uses ‖x‖² + ‖y‖² − 2·x·yᵀ (one matmul), in float64 when the inputs are float32 so the
    cancellation stays harmless for model vectors with millions of entries. Pass `x_sq_norms`
    (‖x_i‖², float64) when x is reused across calls. x is converted chunk by chunk of rows, so a
    (clients × parameters) matrix of models is never copied whole into float64."""
    dtype = torch.float64 if x.dtype in (torch.float16, torch.bfloat16, torch.float32) else x.dtype
    y = y.to(dtype=dtype, device=x.device)
    y_sq = torch.linalg.vector_norm(y, dim=1).square()
    parts = []
    for rows in _row_slices(*x.shape):
        chunk = x[rows].to(dtype)
        chunk_sq = x_sq_norms[rows] if x_sq_norms is not None else torch.linalg.vector_norm(chunk, dim=1).square()
        parts.append(chunk_sq[:, None] + y_sq[None, :] - 2.0 * (chunk @ y.T))
    d = torch.cat(parts) if parts else x.new_zeros((0, y.shape[0]), dtype=dtype)
    return d.clamp_min_(0.0)


# ---------------------------------------------------------------------------- assignment / k-means


def nearest_center(x: torch.Tensor | np.ndarray, centers: torch.Tensor | np.ndarray) -> np.ndarray:
    """Index of the nearest center (Euclidean, torch.cdist in float64) for every row of x; ties
    go to the lowest index. Works through x in chunks of rows, so a large (clients × parameters)
    matrix is never copied whole into float64."""
    x, centers = as_matrix(x), as_matrix(centers)
    centers = centers.to(dtype=torch.float64, device=x.device)
    nearest = [torch.cdist(x[rows].to(torch.float64), centers).argmin(dim=1) for rows in _row_slices(*x.shape)]
    if not nearest:
        return np.zeros(0, dtype=np.int64)
    return torch.cat(nearest).cpu().numpy().astype(np.int64)


@dataclass(frozen=True)
class KMeansResult:
    labels: np.ndarray  # (n,) int64
    centers: torch.Tensor  # (k × d), dtype of the input
    inertia: float  # Σ_i ‖x_i − c_{label_i}‖² (the "intra-cluster distance")
    iterations: int


# Elements of x handled per chunk by k-means' passes: a pass over a (clients × parameters)
# matrix of models then needs one chunk of temporary memory (4 MB in float32), never a copy.
# 16 MB chunks were slower (2,000 × 55,210 float32, K = 2, 10 restarts: 1.2–1.35 s against
# 0.8–0.9 s, the chunk no longer fitting the caches) and left glibc's heap holding 8–117 MiB
# more after a pass; K-means CFL at 2,000 clients peaked at 937–1,024 MiB, now 894–912 (#17).
_CHUNK_ELEMENTS = 1 << 20
# k-means restarts advance together (one pass over x serves all of them) while their centers
# fit in this many elements; larger models run their restarts in smaller groups.
_CENTER_ELEMENTS = 1 << 24


def _row_slices(n: int, features: int) -> list[slice]:
    """Consecutive row ranges of an (n × features) matrix, each about _CHUNK_ELEMENTS large."""
    rows = max(1, _CHUNK_ELEMENTS // max(features, 1))
    return [slice(start, min(start + rows, n)) for start in range(0, n, rows)]


def _column_slices(n: int, features: int) -> list[slice]:
    """Consecutive column ranges of an (n × features) matrix, each about _CHUNK_ELEMENTS large."""
    columns = max(1, _CHUNK_ELEMENTS // max(n, 1))
    return [slice(start, min(start + columns, features)) for start in range(0, features, columns)]


class _Centered:
    """The rows of x as seen from their mean, computed block by block without copying x.

    Squared distances are translation-invariant, and model vectors share a large common part
    (they all descend from one global model), which in ‖x‖² + ‖c‖² − 2·x·c would cancel
    catastrophically in float32. From the mean the remaining parts are small, so the products
    run in x's own precision (float32 for models; half-precision input is raised to float32,
    whose sums over many clients would overflow otherwise), while norms and distances are
    accumulated in float64. The mean is only the origin: any point near the rows would do, as
    every quantity is then taken from the same centered rows.

    Passes go over blocks of columns with every row (not blocks of rows): a Lloyd step's sums
    (label indicators × rows) then have all n rows as their inner dimension instead of a chunk's
    few rows, which re-read and re-wrote the (restarts·k × p) sums once per chunk."""

    def __init__(self, x: torch.Tensor):
        x = x.detach()  # the passes write into a buffer (out=), which autograd refuses
        self.x = x
        self.n, self.p = x.shape
        self.dtype = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
        total = torch.zeros(self.p, dtype=torch.float64, device=x.device)
        for chunk in _row_slices(self.n, self.p):
            total += x[chunk].to(self.dtype).sum(dim=0)
        self.mean = (total / self.n).to(self.dtype)
        self.blocks = _column_slices(self.n, self.p)
        # One block of centered columns, rewritten by every pass: a fresh 4 MB result per block and
        # pass would be a fresh mapping each time wherever the allocator maps large blocks (half-
        # precision input still converts each block first).
        width = self.blocks[0].stop - self.blocks[0].start if self.blocks else 0
        self._pass_buffer = torch.empty(self.n * width, dtype=self.dtype, device=x.device)
        # Each row's ‖x_i − mean‖² and each column's Σ_i (x_i − mean) (float64), taken by the first
        # pass rather than by a pass of their own.
        self._sq: torch.Tensor | None = None
        self._column_sums: torch.Tensor | None = None

    def rows_of(self, chunk: slice) -> torch.Tensor:
        return self.x[chunk].to(self.dtype) - self.mean

    def passes(self):
        """(columns, centered block of every row) for each block of columns in turn; the block lives
        in the pass buffer, valid until the next one."""
        first = self._sq is None
        if first:
            sq = torch.zeros(self.n, dtype=torch.float64, device=self.x.device)
            column_sums = torch.empty(self.p, dtype=torch.float64, device=self.x.device)
        for columns in self.blocks:
            width = columns.stop - columns.start
            rows = torch.sub(self.x[:, columns].to(self.dtype), self.mean[columns],
                             out=self._pass_buffer[:self.n * width].view(self.n, width))
            if first:
                sq += rows.square().sum(dim=1)
                column_sums[columns] = rows.sum(dim=0)
            yield columns, rows
        if first:
            self._sq, self._column_sums = sq, column_sums

    def _first_pass(self) -> None:
        for _ in self.passes():
            pass

    @property
    def sq(self) -> torch.Tensor:
        if self._sq is None:
            self._first_pass()
        return self._sq

    @property
    def column_sums(self) -> torch.Tensor:
        if self._column_sums is None:
            self._first_pass()
        return self._column_sums

    def sq_distances(self, centers: torch.Tensor) -> torch.Tensor:
        """(n × m) float64 squared distances to m centers given in centered coordinates."""
        cross = torch.zeros(self.n, centers.shape[0], dtype=torch.float64, device=self.x.device)
        for columns, rows in self.passes():
            cross += rows @ centers[:, columns].T
        return (self.sq[:, None] + _sq_norms64(centers)[None, :] - 2.0 * cross).clamp_min_(0.0)

    def relative_distances(self, centers: torch.Tensor) -> torch.Tensor:
        """(n × runs × (k − 1)) float64: each row's squared distance to each of a run's centers
        j ≥ 1 ((runs × k × p), centered coordinates) less its distance to the run's first center,
        ‖x − c_j‖² − ‖x − c_0‖² = ‖c_j‖² − ‖c_0‖² − 2·x·(c_j − c_0): the nearest center from
        k − 1 products per row and run instead of k (`_nearest`)."""
        runs, k, _ = centers.shape
        cross = torch.zeros(self.n, runs * (k - 1), dtype=torch.float64, device=self.x.device)
        for columns, rows in self.passes():
            cross += rows @ _center_differences(centers[:, :, columns]).T
        return _relative(cross, centers)

    def rows_relative(self, rows: torch.Tensor, centers: torch.Tensor) -> torch.Tensor:
        """relative_distances of the rows numbered `rows` only, (m × runs × (k − 1)), reading those
        rows alone."""
        runs, k, p = centers.shape
        differences = _center_differences(centers)
        cross = torch.empty(len(rows), runs * (k - 1), dtype=torch.float64, device=self.x.device)
        for part in _row_slices(len(rows), p):
            cross[part] = self.rows_of(rows[part]) @ differences.T
        return _relative(cross, centers)

    def lloyd_step(self, labels: torch.Tensor, counts: torch.Tensor, centers: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One Lloyd update for several runs in one pass over x, with the next assignment's products.

        labels (runs × n), their cluster sizes `counts` (runs × k, float64), centers (runs × k × p,
        centered coordinates). Returns the new centers (each cluster's mean; an empty cluster
        keeps its center, it may win rows back), every row's relative distances to them (as
        relative_distances) and the clusters' sums (runs × (k − 1) × p) for `changed_sums`.

        Sums are taken for the first k − 1 clusters only; the last one's is the column sums less
        theirs (one product fewer per run)."""
        runs, k, p = centers.shape
        device = self.x.device
        offsets = torch.arange(runs, device=device)[:, None] * (k - 1)
        indicators = torch.zeros(runs * (k - 1), self.n, dtype=self.dtype, device=device)
        summed = labels < k - 1
        indicators[(labels + offsets)[summed], torch.arange(self.n, device=device).expand_as(labels)[summed]] = 1
        means = _Means(self, counts)
        new_centers = torch.empty_like(centers)
        sums = torch.empty(runs, k - 1, p, dtype=self.dtype, device=device)
        cross = torch.zeros(self.n, runs * (k - 1), dtype=torch.float64, device=device)
        for columns, rows in self.passes():
            sums[:, :, columns] = (indicators @ rows).view(runs, k - 1, columns.stop - columns.start)
            block = means(sums[:, :, columns], columns, centers)
            new_centers[:, :, columns] = block
            cross += rows @ _center_differences(block).T
        return new_centers, _relative(cross, new_centers), sums

    def changed_sums(self, rows: torch.Tensor, before: torch.Tensor, after: torch.Tensor, k: int) -> torch.Tensor:
        """What moves the clusters' sums (as lloyd_step's) when the rows numbered `rows` go from
        labels `before` to `after` (runs × m): (runs × (k − 1) × p), reading those rows alone."""
        runs = before.shape[0]
        device = self.x.device
        offsets = torch.arange(runs, device=device)[:, None] * (k - 1)
        change = torch.zeros(runs * (k - 1), self.p, dtype=self.dtype, device=device)
        for part in _row_slices(len(rows), self.p):
            moves = torch.zeros(runs * (k - 1), part.stop - part.start, dtype=self.dtype, device=device)
            positions = torch.arange(part.stop - part.start, device=device).expand(runs, -1)
            for labels, sign in ((after[:, part], 1.0), (before[:, part], -1.0)):
                summed = labels < k - 1
                moves.index_put_(((labels + offsets)[summed], positions[summed]),
                                 torch.full((int(summed.sum()),), sign, dtype=self.dtype, device=device),
                                 accumulate=True)
            change.addmm_(moves, self.rows_of(rows[part]))
        return change.view(runs, k - 1, self.p)

    def means(self, sums: torch.Tensor, counts: torch.Tensor, centers: torch.Tensor) -> torch.Tensor:
        """Centers from the clusters' sums (runs × (k − 1) × p) and sizes, as lloyd_step makes them."""
        means = _Means(self, counts)
        new_centers = torch.empty_like(centers)
        for columns in self.blocks:
            new_centers[:, :, columns] = means(sums[:, :, columns], columns, centers)
        return new_centers


class _Means:
    """A block of columns of each cluster's mean from its sum: the last cluster's sum is the
    column sums less the others', an empty cluster keeps its center."""

    def __init__(self, data: _Centered, counts: torch.Tensor):
        self.dtype = data.dtype
        # Taken now: read inside a pass, a first pass of its own would overwrite the pass buffer.
        self.column_sums = data.column_sums
        self.divisor = counts.clamp_min(1)[..., None]
        self.empty = (counts == 0)[..., None] if bool((counts == 0).any()) else None

    def __call__(self, sums: torch.Tensor, columns: slice, centers: torch.Tensor) -> torch.Tensor:
        sums = sums.to(torch.float64)
        last = self.column_sums[columns] - sums.sum(dim=1)
        block = torch.cat([sums, last[:, None]], dim=1).div_(self.divisor).to(self.dtype)
        return block if self.empty is None else torch.where(self.empty, centers[:, :, columns], block)


def _center_differences(centers: torch.Tensor) -> torch.Tensor:
    """(runs·(k − 1) × width): c_j − c_0 for j ≥ 1 of each run's (k × width) block of centers."""
    runs, k, width = centers.shape
    return (centers[:, 1:] - centers[:, :1]).reshape(runs * (k - 1), width)


def _square_norms(centers: torch.Tensor) -> torch.Tensor:
    """(runs × k) float64 squared norms of each run's centers."""
    runs, k, p = centers.shape
    return _sq_norms64(centers.reshape(runs * k, p)).view(runs, k)


def _relative(cross: torch.Tensor, centers: torch.Tensor) -> torch.Tensor:
    """Relative distances (m × runs × (k − 1)) from the products `cross` (m × runs·(k − 1)) with
    _center_differences(centers)."""
    runs, k, _ = centers.shape
    centers_sq = _square_norms(centers)
    relative = (centers_sq[:, 1:] - centers_sq[:, :1])[None] - 2.0 * cross.view(cross.shape[0], runs, k - 1)
    return _tie_equal_centers(relative, centers, first=1)


def _tie_equal_centers(values: torch.Tensor, centers: torch.Tensor, first: int = 0) -> torch.Tensor:
    """Give a center equal to an earlier one of its run (Forgy drew two equal rows: clients that
    never trained hold the same model) the earlier one's values (… × runs × columns for centers
    first, first + 1, …), so that ties go to the lowest index as in Lloyd's algorithm: computed
    from two columns of one product, they may round apart. A center equal to the run's first has
    relative distances of exactly 0 already (its difference is 0)."""
    runs, k, _ = centers.shape
    if k < first + 2:  # no pair of centers whose values it holds
        return values
    norms = _square_norms(centers).tolist()  # one copy from the device; equal centers have equal norms
    for run in range(runs):
        for j in range(max(first, 1), k):
            for i in range(first, j):
                if norms[run][i] == norms[run][j] and torch.equal(centers[run, i], centers[run, j]):
                    values[..., run, j - first] = values[..., run, i - first]
                    break
    return values


def _sq_norms64(matrix: torch.Tensor) -> torch.Tensor:
    """Squared norms of the rows of a 2-D tensor, summed in float64 block of columns by block (no
    float64 copy of the whole, which for runs × k centers of 11M parameters is 176 MB)."""
    total = torch.zeros(matrix.shape[0], dtype=torch.float64, device=matrix.device)
    width = max(1, _CHUNK_ELEMENTS // max(matrix.shape[0], 1))
    for start in range(0, matrix.shape[1], width):
        total += matrix[:, start:start + width].to(torch.float64).square().sum(dim=1)
    return total


def _nearest(relative: torch.Tensor) -> torch.Tensor:
    """The nearest center's index from relative distances (… × (k − 1)); ties go to the lowest."""
    return torch.cat([relative.new_zeros(relative.shape[:-1] + (1,)), relative], dim=-1).argmin(dim=-1)


def _undecided(lower: torch.Tensor, upper: torch.Tensor) -> torch.Tensor:
    """(… ) True where relative distances known only within [lower, upper] (… × (k − 1)) leave
    the nearest center open: the own center's upper bound is not below every other's lower."""
    zeros = lower.new_zeros(lower.shape[:-1] + (1,))
    lower, upper = torch.cat([zeros, lower], dim=-1), torch.cat([zeros, upper], dim=-1)
    own = lower.argmin(dim=-1, keepdim=True)
    others = lower.scatter(-1, own, float("inf")).amin(dim=-1, keepdim=True)
    return ~(upper.gather(-1, own) < others).squeeze(-1)


# A step reads only the rows whose label may change while they are at most this share of all rows
# (gathering a row costs about what a pass spends on it); otherwise it makes a full pass.
_BOUNDED_SHARE = 0.5


def _lloyd(data: _Centered, starts: torch.Tensor, max_iter: int, tol: float
           ) -> list[tuple[np.ndarray, torch.Tensor, float, int]]:
    """Lloyd's iterations for several restarts at once: starts is (runs × k × p) in centered
    coordinates. Each run stops on its own (labels unchanged, or center shift ≤ tol) and is
    then left as it is, so every run ends where it would have ended alone, up to float rounding:
    the runs share one product per pass, which may round differently from a product of one run's
    centers (labels and centers agree in the tests; inertias may differ in the last digits).

    A step's new centers and the next assignment's products come from one pass (lloyd_step), so
    a run that converges after t assignments costs t passes, not t + 1, and a run that stops on
    unchanged labels needs no pass for its inertia: its centers are the means of those labels,
    so it is Σ_i ‖x_i‖² − Σ_k n_k‖c_k‖².

    Once few labels change, a step reads only some rows (Hamerly's bounds, as relative
    distances): the sums move by the rows that changed cluster, and each row's relative distances
    are known within bounds that widen by ±2‖x_i‖·‖Δ(c_j − c_0)‖ as the centers move; only the
    rows whose bounds leave their nearest center open are computed again. The bounds carry a
    margin of 1,024 rounding units of the products' precision, so a row near a tie is computed
    again rather than decided by its bounds. A row computed alone sums its products in another
    order than a pass does, so a restart can end elsewhere than with full passes only where a
    row lies within rounding of a tie (as between CPUs)."""
    runs, k, p = starts.shape
    device = starts.device
    centers = starts.clone()
    lower = data.relative_distances(centers)  # relative distances known within [lower, upper]
    upper = lower.clone()
    labels = torch.full((runs, data.n), -1, dtype=torch.long, device=device)
    sums = torch.empty(runs, k - 1, p, dtype=data.dtype, device=device)
    iterations = [0] * runs
    inertia: list[float | None] = [None] * runs
    between = [0.0] * runs
    slack = 1024 * torch.finfo(data.dtype).eps
    active = list(range(runs))
    for iteration in range(1, max_iter + 1):
        moving, assigned = [], []
        changed = torch.zeros(data.n, dtype=torch.bool, device=device)
        for run in active:
            nearest = _nearest(lower[:, run])
            iterations[run] = iteration
            if iteration > 1 and torch.equal(nearest, labels[run]):  # its centers are these labels' means
                # (less 0 by rounding where every row is its own cluster)
                inertia[run] = max(0.0, float(data.sq.sum()) - between[run])
                continue
            moving.append(run)
            assigned.append(nearest)
            changed |= nearest != labels[run]
        if not moving:
            break
        index = torch.tensor(moving, device=device)
        before, after = labels[index], torch.stack(assigned)
        labels[index] = after
        counts = torch.zeros(len(moving) * k, dtype=torch.float64, device=device)
        counts.index_add_(0, (after + torch.arange(len(moving), device=device)[:, None] * k).reshape(-1),
                          torch.ones(after.numel(), dtype=torch.float64, device=device))
        counts = counts.view(len(moving), k)
        old_centers = centers[index]
        rows = changed.nonzero().squeeze(1)
        if iteration == 1 or len(rows) > _BOUNDED_SHARE * data.n:
            new_centers, exact, sums[index] = data.lloyd_step(after, counts, old_centers)
            new_sq = _square_norms(new_centers)
            lower[:, index] = upper[:, index] = exact
        else:
            sums[index] += data.changed_sums(rows, before[:, rows], after[:, rows], k)
            new_centers = data.means(sums[index], counts, old_centers)
            old_sq, new_sq = _square_norms(old_centers), _square_norms(new_centers)
            shift = (new_sq[:, 1:] - new_sq[:, :1]) - (old_sq[:, 1:] - old_sq[:, :1])
            moved = _sq_norms64(_center_differences(new_centers) - _center_differences(old_centers)).sqrt()
            spread = _sq_norms64(_center_differences(new_centers)).sqrt()
            norms = data.sq.sqrt()[:, None, None]
            reach = 2.0 * norms * moved.view(1, len(moving), k - 1)
            reach += slack * (2.0 * norms * spread.view(1, len(moving), k - 1) + new_sq[:, 1:] + new_sq[:, :1])
            lower[:, index] += shift[None] - reach
            upper[:, index] += shift[None] + reach
            open_rows = _undecided(lower[:, index], upper[:, index]).any(dim=1).nonzero().squeeze(1)
            if len(open_rows) > _BOUNDED_SHARE * data.n:
                lower[:, index] = upper[:, index] = data.relative_distances(new_centers)
            elif len(open_rows):
                exact = data.rows_relative(open_rows, new_centers)
                lower[open_rows[:, None], index] = upper[open_rows[:, None], index] = exact
        settled = _sq_norms64((new_centers - old_centers).reshape(len(moving), -1)) <= tol if tol > 0 else None
        centers[index] = new_centers
        new_between = (counts * new_sq).sum(dim=1)
        active = []
        for j, run in enumerate(moving):
            between[run] = float(new_between[j])
            if settled is None or not bool(settled[j]):
                active.append(run)
        if not active:
            break
    # Stopped by max_iter or tol: the labels follow the last centers, which are not their means.
    unsettled = [run for run in range(runs) if inertia[run] is None]
    if unsettled:
        d = _tie_equal_centers(data.sq_distances(centers[unsettled].reshape(-1, p)).view(data.n, len(unsettled), k),
                               centers[unsettled])
        for j, run in enumerate(unsettled):
            labels[run] = d[:, j].argmin(dim=1)
            inertia[run] = float(d[:, j].gather(1, labels[run][:, None]).sum())
    return [(labels[run].cpu().numpy().astype(np.int64), centers[run], inertia[run], iterations[run])
            for run in range(runs)]


def _kmeans_pp(data: _Centered, k: int, rng: np.random.Generator) -> torch.Tensor:
    n = data.n
    chosen = [int(rng.integers(n))]
    closest = data.sq_distances(data.rows_of(slice(chosen[0], chosen[0] + 1)))[:, 0]
    for _ in range(1, k):
        weights = closest.cpu().numpy()
        total = weights.sum()
        index = int(rng.choice(n, p=weights / total)) if total > 0 else int(rng.integers(n))
        chosen.append(index)
        closest = torch.minimum(closest, data.sq_distances(data.rows_of(slice(index, index + 1)))[:, 0])
    return torch.cat([data.rows_of(slice(i, i + 1)) for i in chosen])


def kmeans(x: torch.Tensor | np.ndarray, k: int, *, seed: Seed = 0, n_init: int = 10,
           init: Literal["random", "k-means++"] | torch.Tensor = "random", max_iter: int = 100,
           tol: float = 0.0) -> KMeansResult:
    """Lloyd's k-means (EM with hard assignments) on the rows of x, on x's device.

    `init`: "random" draws k distinct rows as initial centers (Forgy), "k-means++" uses D²
    sampling, or pass a (k × d) tensor of initial centers (then n_init is 1). With n_init > 1 the
    run with the lowest inertia (sum of squared intra-cluster distances) wins; ties go to the
    earliest run, and runs that end in the same partition are ties whatever their clusters'
    order (see `_better`). Deterministic for a given seed.

    Sized for the server's (clients × parameters) matrices of models: x is read in chunks and
    never copied, products run in x's precision after centering (see `_Centered`), distances
    are accumulated in float64, and restarts share each pass over x."""
    x = as_matrix(x)
    n, p = x.shape
    if not 1 <= k <= n:
        raise ValueError(f"kmeans: k must be in [1, {n}], got {k}")
    if not isinstance(init, torch.Tensor) and init not in ("random", "k-means++"):
        raise ValueError(f"kmeans: unknown init {init!r}")
    data = _Centered(x)
    rng = as_generator(seed)

    def start() -> torch.Tensor:  # one restart's initial centers, in centered coordinates
        if init == "random":
            rows = np.sort(rng.choice(n, size=k, replace=False))
            return torch.cat([data.rows_of(slice(r, r + 1)) for r in rows])
        return _kmeans_pp(data, k, rng)

    runs = 1 if isinstance(init, torch.Tensor) else max(1, n_init)
    group = max(1, _CENTER_ELEMENTS // max(k * p, 1))
    best = None
    for first in range(0, runs, group):
        # Drawn group by group (Lloyd draws nothing, so the draws are those of drawing all first).
        if isinstance(init, torch.Tensor):
            starts = (as_matrix(init).to(dtype=data.dtype, device=x.device) - data.mean)[None]
        else:
            starts = torch.stack([start() for _ in range(first, min(first + group, runs))])
        for result in _lloyd(data, starts, max_iter, tol):
            if best is None or _better(result, best):
                best = result
    labels, centers, inertia, iterations = best
    return KMeansResult(labels, (centers + data.mean).to(x.dtype), inertia, iterations)


def _better(result: tuple, best: tuple) -> bool:
    """Whether a later restart replaces the best so far: a lower inertia and another partition.
    Restarts that find one partition under other cluster numbers get inertias that differ in the
    last bits (the last cluster's sum comes from the column sums), so rounding alone would pick
    which numbering wins, and a method that matches clusters by number (CFL-GP, FCCA) would
    follow it: a device or trainer whose models differ in the last bits then gave another run."""
    if best[2] != best[2]:  # a NaN inertia never wins, and any number beats it
        return result[2] == result[2]
    if not result[2] < best[2]:
        return False
    return not np.array_equal(canonical_labels(result[0]), canonical_labels(best[0]))
