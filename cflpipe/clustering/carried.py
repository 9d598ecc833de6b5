"""Lloyd's k-means carried from one round to the next, reading only the rows a round changed.

A server that clusters every client's latest model each round (K-means CFL) re-clusters a table in
which only the round's participants moved. Lloyd's algorithm continued from the last round's
clusters gives the same partition whether it re-reads every row or only those whose nearest centre
may have changed; Hamerly's bounds (2010) tell which: each row keeps an upper bound on its distance
to its own centre and a lower bound on its distance to any other, loosened by how far the centres
moved since they were exact. Rows whose bounds still separate are not read; the round's changed
rows and the uncertain ones are, so a round costs what its movers and the boundary cost, not the
table. Per-cluster sums are kept in float64 and updated by the rows that join or leave, so the
means need no pass either.

The state is a few tensors (`state`, `from_state`): sums (k × p), counts, centres, labels and the
two bounds (n each), checkpointed by the method that keeps it."""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import torch

from cflpipe.clustering.engine import _row_slices

# Bounds are compared with this relative slack: a row within it of the boundary is read again, so
# rounding (distances in the table's precision about the centres' mean, the carried sums) does not
# keep a row in a cluster whose centre is no longer nearest by more than that.
_SLACK = 1e-4


@dataclass
class CarriedKMeans:
    sums: torch.Tensor     # (k, p) float64: the sum of each cluster's rows
    counts: torch.Tensor   # (k,) int64
    centers: torch.Tensor  # (k, p) float64: the centres the bounds refer to
    labels: torch.Tensor   # (n,) int64; -1: a row not clustered (absent)
    upper: torch.Tensor    # (n,) float64: ≥ the distance to the row's own centre
    lower: torch.Tensor    # (n,) float64: ≤ the distance to every other centre

    @property
    def k(self) -> int:
        return int(self.sums.shape[0])

    def state(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_state(cls, state: dict[str, torch.Tensor], device: torch.device | str = "cpu") -> "CarriedKMeans":
        return cls(**{name: value.to(device) for name, value in state.items()})

    @classmethod
    def start(cls, table: torch.Tensor, rows: np.ndarray, labels: np.ndarray, k: int) -> "CarriedKMeans":
        """From a clustering of `rows` of the table (labels 0..k−1, each present: an empty cluster
        would have no centre to start from); other rows are absent."""
        if len(np.unique(labels)) != k:
            raise ValueError(f"CarriedKMeans.start: {len(np.unique(labels))} of {k} clusters have rows")
        n, p = table.shape
        device = table.device
        state = cls(torch.zeros(k, p, dtype=torch.float64, device=device),
                    torch.zeros(k, dtype=torch.int64, device=device),
                    torch.zeros(k, p, dtype=torch.float64, device=device),
                    torch.full((n,), -1, dtype=torch.int64, device=device),
                    torch.zeros(n, dtype=torch.float64, device=device),
                    torch.zeros(n, dtype=torch.float64, device=device))
        index = torch.from_numpy(np.asarray(rows, dtype=np.int64)).to(device)
        state.labels[index] = torch.from_numpy(np.asarray(labels, dtype=np.int64)).to(device)
        state._move(table, index, state.labels[index])
        state._settle(table, index)
        return state

    def update(self, table: torch.Tensor, movers: np.ndarray, old_rows: torch.Tensor | None,
               max_iter: int = 100) -> np.ndarray:
        """Continue Lloyd's algorithm after the rows `movers` of the table changed (`old_rows`:
        their values before, aligned with movers; ignored for rows not clustered yet, which join
        their nearest centre). Returns the labels of every row (−1: not clustered)."""
        device = table.device
        index = torch.from_numpy(np.asarray(movers, dtype=np.int64)).to(device)
        if len(index):
            old_labels = self.labels[index]
            kept = old_labels >= 0
            if bool(kept.any()):  # a moved row stays in its cluster with its new value, to begin with
                change = table[index[kept]].to(torch.float64) - old_rows.to(device)[kept].to(torch.float64)
                self.sums.index_add_(0, old_labels[kept], change)
        self._settle(table, index, max_iter)
        return self.labels.cpu().numpy()

    def _settle(self, table: torch.Tensor, changed: torch.Tensor, max_iter: int = 100) -> None:
        """Lloyd's steps until no row changes cluster, reading the `changed` rows and, after them,
        only rows whose bounds no longer separate their own centre from the others."""
        read = torch.zeros(len(self.labels), dtype=torch.bool, device=table.device)
        read[changed] = True  # their bounds say nothing any more
        for _ in range(max_iter):
            self._loosen(self._means(self.centers))
            uncertain = read | ((self.labels >= 0) & (self.upper * (1 + _SLACK) >= self.lower * (1 - _SLACK)))
            rows = uncertain.nonzero().squeeze(1)
            read[:] = False
            if not len(rows):
                break
            before = self.labels[rows].clone()
            self._exact(table, rows)
            moved = self.labels[rows] != before
            if not bool(moved.any()):
                break
            self._move(table, rows[moved], self.labels[rows[moved]], before[moved])
        else:  # out of iterations: the bounds follow the last move's centres
            self._loosen(self._means(self.centers))

    def means(self) -> torch.Tensor:
        """(k × p) float64: each cluster's mean (an empty cluster keeps its last centre)."""
        return self._means(self.centers)

    # ------------------------------------------------------------------ steps

    def _means(self, fallback: torch.Tensor) -> torch.Tensor:
        present = self.counts > 0
        means = self.sums / self.counts.clamp_min(1)[:, None].to(torch.float64)
        return torch.where(present[:, None], means, fallback)

    def _loosen(self, centers: torch.Tensor) -> None:
        """Move the bounds to new centres: each row's own centre moved at most this far away, any
        other at most this far closer (Hamerly's updates); then the centres are the new ones."""
        shift = torch.linalg.vector_norm(centers - self.centers, dim=1)
        self.centers = centers
        if not bool((shift > 0).any()):
            return
        present = self.labels >= 0
        own = self.labels.clamp_min(0)
        top = torch.topk(shift, min(2, self.k)).indices
        largest, second = shift[top[0]], shift[top[-1]]
        other = torch.where(own == top[0], second, largest)
        self.upper += torch.where(present, shift[own], 0.0)
        self.lower -= torch.where(present, other, 0.0)

    def _exact(self, table: torch.Tensor, rows: torch.Tensor) -> None:
        """The nearest centre and both bounds of `rows`, from their distances to every centre, taken
        in the table's precision about the centres' mean (the rows lie close together: the
        products are then no less exact than the k-means engine's, and a read row costs a copy)."""
        dtype = torch.float32 if table.dtype in (torch.float16, torch.bfloat16) else table.dtype
        # one origin in the table's precision for rows and centres alike: a float64 one for the
        # centres would shift every row by its rounding, eps × the models' common part
        origin = self.centers.mean(dim=0).to(dtype)
        centers = (self.centers - origin.to(torch.float64)).to(dtype)
        squares = _sq_norms(centers).to(torch.float64)
        for part in _row_slices(len(rows), table.shape[1]):
            index = rows[part]
            x = table[index].to(dtype) - origin
            cross = (x @ centers.T).to(torch.float64)
            d = (_sq_norms(x).to(torch.float64)[:, None] + squares[None, :] - 2.0 * cross).clamp_min_(0.0).sqrt_()
            if self.k > 1:
                nearest = d.argmin(dim=1)  # ties to the lowest index, as the k-means engine's
                upper = d.gather(1, nearest[:, None]).squeeze(1)
                d.scatter_(1, nearest[:, None], float("inf"))
                self.labels[index], self.upper[index], self.lower[index] = nearest, upper, d.min(dim=1).values
            else:
                self.labels[index], self.upper[index] = 0, d[:, 0]
                self.lower[index] = float("inf")

    def _move(self, table: torch.Tensor, rows: torch.Tensor, to: torch.Tensor, source: torch.Tensor | None = None) -> None:
        """Rows join the clusters `to`, leaving `source` (−1: none)."""
        for part in _row_slices(len(rows), table.shape[1]):
            x = table[rows[part]].to(torch.float64)
            self.sums.index_add_(0, to[part], x)
            self.counts.index_add_(0, to[part], torch.ones_like(to[part]))
            if source is not None:
                left = source[part] >= 0
                self.sums.index_add_(0, source[part][left], -x[left])
                self.counts.index_add_(0, source[part][left], -torch.ones_like(source[part][left]))


def _sq_norms(x: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(x, dim=1).square()
