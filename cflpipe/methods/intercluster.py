"""AWCFL and MCFL (seed paper 001): the maths of the two options every cluster-model method
cluster-model method has (methods/clustered.py applies them; registering a cluster method
registers `<method>_awcfl` and `<method>_mcfl`, e.g. `cfl_awcfl`, `ifca_mcfl`; `awcfl` and
`mcfl` are the paper's standalone Algorithms 1–2, K-means CFL with the option).

AWCFL (eq. 2): after intra-cluster averaging, C_k ← β/(K−1)·Σ_{j≠k} C_j + (1−β)·C_k.
MCFL: every client receives all K cluster models (counted in bytes down); each client uploads the
mean of n sampled training inputs (its feature mean); a cluster's feature mean is the average of
its members' means; any test data is evaluated with the cluster model whose feature mean is
nearest (L2) to the mean of n sampled test inputs.
"""

from __future__ import annotations

import numpy as np
import torch


def awcfl_mix(centers: torch.Tensor, beta: float) -> torch.Tensor:
    """C_k ← β/(K−1)·Σ_{j≠k} C_j + (1−β)·C_k for all k at once; one cluster is left alone. At
    β = (K−1)/K (the paper's 0.5 with K = 2) every cluster gets the same model, the mean of all:
    the paper's formula, kept as it is."""
    k = centers.shape[0]
    if k < 2 or beta == 0:
        return centers
    others = centers.sum(0, keepdim=True) - centers
    return beta / (k - 1) * others + (1 - beta) * centers


def sample_mean(x: torch.Tensor, n: int, rng: np.random.Generator) -> torch.Tensor:
    """Mean of n inputs drawn without replacement (all of them when there are fewer), flattened;
    zeros for an empty set (a client whose only sample went to its train split)."""
    if len(x) == 0:
        return x.new_zeros(int(np.prod(x.shape[1:])))
    if len(x) > n:
        x = x[torch.from_numpy(np.sort(rng.choice(len(x), n, replace=False))).to(x.device)]
    return x.reshape(len(x), -1).mean(0)


