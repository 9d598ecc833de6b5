"""CFL-GP: hyper-parameters and declaration, torch-free so that `validate` and `cflpipe methods` read
them without importing `cflpipe.methods.cflgp`, which implements it."""

from __future__ import annotations

from pydantic import Field

from cflpipe.methods.intercluster_params import cluster_options
from cflpipe.registry import Capabilities, HyperParams, declare


class CFLGPParams(HyperParams):
    clusters: int = Field(4, ge=1, description="K: cluster models (the authors' default 4)")
    period: int = Field(2, ge=1, description="rounds between two profile updates and clusterings (the authors' "
                                             "clustering_period: 2)")
    stop_after: int = Field(10, ge=1, description="no clustering from this round on (the authors' "
                                                  "clustering_termination_threshold: 10)")
    profile_share: float = Field(
        1.0, gt=0, le=1,
        description="share of the parameters a profile keeps, a seeded random choice of coordinates fixed for the "
                    "run (the authors' use_reduced_G keeps 1 %: 0.01); 1: the whole update. Below 1 the profiles "
                    "take clients × share × parameters of memory and their SVD that much less time")


declare("cflgp", CFLGPParams, "cflpipe.methods.cflgp:CFLGP",
        Capabilities(clustered=True, k_param="clusters"), variants=cluster_options("cflgp"), family="clustered", variant_family="modifier",
        at_scale="the exact SVD of every profiled client's whole update (each `period` rounds until `stop_after`) and a clients × parameters profile table: server 9× its training, 3.5 GiB; `profile_share: 0.01` (the authors' use_reduced_G) meets both, at some ARI under label skew, its final evaluation then 1.7× two training rounds")
