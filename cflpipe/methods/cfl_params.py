"""CFL: hyper-parameters, first clustering round and declaration, torch-free so that `validate` and
`cflpipe methods` read them without importing `cflpipe.methods.cfl`, which implements it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from cflpipe.methods.intercluster_params import cluster_options
from cflpipe.registry import Capabilities, HyperParams, declare


class CFLParams(HyperParams):
    eps1: float | None = Field(None, gt=0, description="split only when the norm of the cluster's mean update "
                                                       "is below this (default: 0.5 relative; 0.4 absolute, the "
                                                       "reference code's MNIST value)")
    eps2: float | None = Field(None, gt=0, description="…and the largest member update norm is above this "
                                                       "(default: 0.6 relative; 1.6 absolute, the reference "
                                                       "code's MNIST value)")
    warmup: int = Field(20, ge=0, description="no split before this many rounds have completed "
                                              "(reference code: c_round > 20)")
    min_members: int = Field(3, ge=2, description="split only clusters with at least this many members "
                                                  "updating this round (reference code: > 2)")
    gamma_max: float | None = Field(
        None, ge=0, lt=1,
        description="accept a split only if sqrt((1 - a)/2) > gamma_max, a = the largest cosine similarity "
                    "between members of the two halves (the paper's bound on the clients' gradient noise); "
                    "0 accepts every split, as the reference code (default: 0.5 relative, 0 absolute)")
    thresholds: Literal["absolute", "relative"] = Field(
        "relative", description="relative: eps1/eps2 are multiples of the warm-up rounds' mean largest client "
                                "update norm (scale-free); absolute: they are update norms (the reference code)")

    @model_validator(mode="after")
    def _relative_needs_warmup(self) -> "CFLParams":
        if self.thresholds == "relative" and self.warmup < 1:
            raise ValueError("thresholds: relative measures its scale in the warm-up rounds, so warmup must be >= 1")
        return self


def _cfl_starts(hp: CFLParams) -> tuple[str, int]:
    return "warmup", hp.warmup  # a split is decided from 0-based round `warmup` on


declare("cfl", CFLParams, "cflpipe.methods.cfl:CFL",
        Capabilities(clustered=True, pairs="the cosine similarity of every pair of a cluster's clients in a round (of every client in the paper's full participation)", pair_bytes=24, pairs_round=True), _cfl_starts, cluster_options("cfl"), family="clustered",
        variant_family="modifier",
        at_scale="meets the bars: server 0.32-0.44x its training at 1,000-100,000 clients (its bipartition round was 1.1x while it imported scipy)")
