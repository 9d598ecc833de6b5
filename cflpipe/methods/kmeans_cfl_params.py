"""K-means CFL (and the AWCFL and MCFL of seed paper 001): hyper-parameters, first clustering round and
declaration, torch-free so that `validate` and `cflpipe methods` read them without importing
`cflpipe.methods.kmeans_cfl`, which implements it."""

from __future__ import annotations

from pydantic import Field

from cflpipe.methods.intercluster_params import cluster_options
from cflpipe.registry import Capabilities, HyperParams, declare


class KMeansCFLParams(HyperParams):
    clusters: int = Field(2, ge=1, description="K of the K-means on client models (AWCFL/MCFL's paper states none; 2: its two groups)")
    cluster_start: int = Field(20, ge=0, description="rounds of plain FedAvg before clustering (paper: 20)")
    n_init: int = Field(10, ge=1, description="K-means restarts (the best inertia wins)")


def _kmeans_cfl_starts(hp: KMeansCFLParams) -> tuple[str, int]:
    return "cluster_start", max(hp.cluster_start - 1, 0)  # clusters once round + 1 >= cluster_start


# AWCFL and MCFL are the paper's own algorithms on K-means CFL: their variants keep the bare names.
declare("kmeans_cfl", KMeansCFLParams, "cflpipe.methods.kmeans_cfl:KMeansCFL",
        Capabilities(clustered=True, k_param="clusters"), _kmeans_cfl_starts, cluster_options("kmeans_cfl", awcfl="awcfl", mcfl="mcfl"),
        family="clustered", variant_family="seed",
        at_scale="once every client has uploaded, k-means over all N latest models each round: 5.5 s (it would be 2.5 s warm-started) against 0.3 s of training")
