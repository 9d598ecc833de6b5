"""LCFed: hyper-parameters and declaration, torch-free so that `validate` and `cflpipe methods` read
them without importing `cflpipe.methods.lcfed`, which implements it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from cflpipe.registry import Capabilities, HyperParams, declare


class LCFedParams(HyperParams):
    clusters: int = Field(2, ge=1, description="number of clusters K (at most: no cluster-number tuning adds one; a cluster "
                                                  "left without members is dropped)")
    mu: float = Field(0.01, ge=0, description="pull of the personalized model to its cluster center (μ)")
    lam: float = Field(0.1, ge=0, description="pull of the embedding to the global embedding Φ (λ)")
    components: int = Field(50, ge=1, description="PCA dimensions D of LrCos (paper: 50)")
    pca_every: int | None = Field(None, ge=1, description="refit the PCA map every N rounds (default: a tenth of "
                                                          "the run's rounds, the paper's 100 of 1,000)")
    similarity: Literal["lrcos", "l2"] = Field("lrcos", description="E-step similarity (ablation: l2)")


declare("lcfed", LCFedParams, "cflpipe.methods.lcfed:LCFed",
        Capabilities(clustered=True, personalized=True, k_param="clusters"), family="clustered",
        at_scale="FedAC's M-step over every client's ω_i each round: server 7× its training")
