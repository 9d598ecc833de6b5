"""K-means CFL (and the AWCFL and MCFL of seed paper 001): hyper-parameters, first clustering round and
declaration, torch-free so that `validate` and `cflpipe methods` read them without importing
`cflpipe.methods.kmeans_cfl`, which implements it."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from cflpipe.methods.intercluster_params import cluster_options
from cflpipe.registry import Capabilities, HyperParams, declare


class KMeansCFLParams(HyperParams):
    later_defaults: ClassVar[dict[str, Any]] = {"kmeans_start": "fresh"}  # added 2026-12-02
    clusters: int = Field(2, ge=1, description="K of the K-means on client models (AWCFL/MCFL's paper states none; 2: its two groups)")
    cluster_start: int = Field(20, ge=0, description="rounds of plain FedAvg before clustering (paper: 20)")
    n_init: int = Field(10, ge=1, description="K-means restarts (the best inertia wins)")
    kmeans_start: Literal["fresh", "last"] = Field(
        "fresh", description="where each round's K-means starts once clustering has begun: afresh (n_init "
                             "random restarts over every client's model) or from the last round's clusters "
                             "(Lloyd's algorithm carried over, reading the round's changed rows and those near a "
                             "boundary: server 0.52-0.77x its training at 1,000-10,000 clients against 6.5-8.5x, but "
                             "worse clusters under partial participation; docs/performance.md). Algorithm 1 step "
                             "3.2 states no initialization")


def _kmeans_cfl_starts(hp: KMeansCFLParams) -> tuple[str, int]:
    return "cluster_start", max(hp.cluster_start - 1, 0)  # clusters once round + 1 >= cluster_start


# AWCFL and MCFL are the paper's own algorithms on K-means CFL: their variants keep the bare names.
declare("kmeans_cfl", KMeansCFLParams, "cflpipe.methods.kmeans_cfl:KMeansCFL",
        Capabilities(clustered=True, k_param="clusters"), _kmeans_cfl_starts, cluster_options("kmeans_cfl", awcfl="awcfl", mcfl="mcfl"),
        family="clustered", variant_family="seed",
        at_scale="with the default fresh K-means each round (n_init restarts over all N latest models) the server is "
                 "6.5-7.4x its training at 1,000 clients and 7.1-8.5x at 10,000 (5.5 s once all 10,000 have uploaded); "
                 "kmeans_start: last carries Lloyd's algorithm from the last round (0.52-0.77x) but found worse clusters "
                 "under partial participation on 2 of 3 scenarios, so it is not the default")
