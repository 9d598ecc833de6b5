"""Parameter space: one model whose parameters are views into a single flat vector.

Loading a client's model is then one copy into that vector, reading it one clone, and the
optimizer, proximal pulls and masks are a handful of vector operations instead of loops over
parameter tensors. Server math works on stacked vectors (clients × parameters)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from cflpipe.models import body_parameter_names, head_parameter_names, layer_of_parameters


@dataclass(frozen=True)
class Slot:
    name: str
    offset: int
    numel: int
    shape: tuple[int, ...]
    layer: int


class ParamSpace:
    """A model bound to a flat parameter vector `flat` and a flat gradient vector `grad`."""

    def __init__(self, model: nn.Module, device: torch.device | str = "cpu"):
        self.model = model.to(device)
        self.device = torch.device(device)
        params = list(self.model.named_parameters())
        # The run's models name their layers (body/head masks, first-L layers); an auxiliary
        # network of a method (any module) counts every parameter tensor as a layer of its own
        # and has no body/head split.
        layered = hasattr(self.model, "layers")
        layers = layer_of_parameters(self.model) if layered else list(range(len(params)))
        slots, offset = [], 0
        for (name, p), layer in zip(params, layers):
            slots.append(Slot(name, offset, p.numel(), tuple(p.shape), layer))
            offset += p.numel()
        self.slots: tuple[Slot, ...] = tuple(slots)
        self.size = offset
        self.num_layers = max(layers) + 1 if layers else 0
        dtype = params[0][1].dtype
        self.flat = torch.empty(self.size, dtype=dtype, device=self.device)
        self.grad = torch.zeros(self.size, dtype=dtype, device=self.device)
        with torch.no_grad():
            for slot, (_, p) in zip(self.slots, params):
                view = self.flat[slot.offset:slot.offset + slot.numel].view(slot.shape)
                view.copy_(p)
                p.data = view
                # Autograd accumulates in place into an existing dense .grad, so every
                # backward pass writes straight into the flat gradient vector.
                p.grad = self.grad[slot.offset:slot.offset + slot.numel].view(slot.shape)
        self._body = self.mask_of(body_parameter_names(self.model) if layered else [])
        self._head = self.mask_of(head_parameter_names(self.model) if layered else [])

    # ------------------------------------------------------------------ vectors

    def read(self) -> torch.Tensor:
        return self.flat.detach().clone()

    def load(self, vector: torch.Tensor) -> None:
        self.flat.copy_(vector)

    def zeros(self) -> torch.Tensor:
        return torch.zeros_like(self.flat)

    def grads_are_flat(self) -> bool:
        """True while every parameter's .grad still lives inside `grad` (checked by tests)."""
        start, end = self.grad.data_ptr(), self.grad.data_ptr() + self.size * self.grad.element_size()
        return all(p.grad is not None and start <= p.grad.data_ptr() < end for p in self.model.parameters())

    # ------------------------------------------------------------------ masks

    def mask_of(self, names) -> torch.Tensor:
        wanted = set(names)
        unknown = wanted - {s.name for s in self.slots}
        if unknown:
            raise KeyError(f"unknown parameters: {sorted(unknown)}")
        mask = torch.zeros(self.size, dtype=torch.bool, device=self.device)
        for slot in self.slots:
            if slot.name in wanted:
                mask[slot.offset:slot.offset + slot.numel] = True
        return mask

    @property
    def body(self) -> torch.Tensor:
        """Embedding (all layers but the decision layer)."""
        return self._body

    @property
    def head(self) -> torch.Tensor:
        """Decision layer (the last fully-connected layer)."""
        return self._head

    def first_layers(self, count: int) -> torch.Tensor:
        """Parameters of the first `count` layers (FedTSDP's shared layers)."""
        mask = torch.zeros(self.size, dtype=torch.bool, device=self.device)
        for slot in self.slots:
            if slot.layer < count:
                mask[slot.offset:slot.offset + slot.numel] = True
        return mask

    def nbytes(self, mask: torch.Tensor | None = None) -> int:
        count = self.size if mask is None else int(mask.sum())
        return count * self.flat.element_size()


# ---------------------------------------------------------------------- server-side math


def weighted_average(vectors: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Σ w_i v_i / Σ w_i over the rows of a (clients × parameters) matrix: one product."""
    weights = weights.to(vectors.dtype)
    return (weights / weights.sum()) @ vectors


def cluster_average(vectors: torch.Tensor, clusters: torch.Tensor, weights: torch.Tensor,
                    num_clusters: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted mean of the rows of each cluster as one (K × n) @ (n × P) product.

    Returns the (K × P) means and a boolean vector of the clusters that had members (rows of
    empty clusters are zero and should be left to the caller)."""
    clusters = clusters.to(vectors.device)
    onehot = torch.zeros(num_clusters, vectors.shape[0], dtype=vectors.dtype, device=vectors.device)
    onehot[clusters, torch.arange(vectors.shape[0], device=vectors.device)] = weights.to(vectors)
    totals = onehot.sum(dim=1)
    present = totals > 0
    means = (onehot / totals.clamp_min(torch.finfo(vectors.dtype).tiny)[:, None]) @ vectors
    return means, present
