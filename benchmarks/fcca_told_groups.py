"""FCCA told the true groups: a diagnostic for #68 item 3, not a method (docs/fcca.md, "Told the groups").

FCCA's accuracy gap to Oracle has two possible sources: its clustering (k-means on the server's
cINN similarity D) and the split of its model (one global encoder for every client, a classifier
head per cluster), where Oracle trains a whole model per true group. This subclass keeps every
step of FCCA's training and aggregation and replaces only the clustering by the scenario's true
groups, so the head of cluster k is averaged over group k's clients. Its cINN still trains (one
mini-batch step a round, `flow_steps: 1` in the spec: with the clustering given, the cINN
changes nothing else) and the server still computes D.

    PYTHONPATH=benchmarks cflpipe train --config benchmarks/fcca_told_groups.yaml \
        --scenario mnist1d-swap5 --method fcca_told --seed 0

The spec's scenarios are fcca_paper_embedded.yaml's and fcca_mnist10k.yaml's, at the same
training settings, so the runs compare with those specs' FCCA and Oracle runs seed for seed.
"""

from __future__ import annotations

import numpy as np
import torch

from cflpipe.clustering import canonical_labels
from cflpipe.methods import register
from cflpipe.methods.fcca import FCCA
from cflpipe.methods.fcca_params import FCCAParams


@register("fcca_told_groups", FCCAParams)
class FCCAToldGroups(FCCA):
    """FCCA with its k-means on D replaced by the scenario's true groups (a diagnostic)."""

    def clustering(self, similarity: torch.Tensor, known: np.ndarray) -> np.ndarray:
        return canonical_labels(np.asarray(self.ctx.data.groups)[known])
