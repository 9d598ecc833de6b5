"""FL+HC: hyper-parameters, first clustering round and declaration, torch-free so that `validate` and
`cflpipe methods` read them without importing `cflpipe.methods.flhc`, which implements it."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from cflpipe.methods.intercluster_params import cluster_options
from cflpipe.registry import Capabilities, HyperParams, declare


class FLHCParams(HyperParams):
    cluster_round: int = Field(
        10, ge=0,
        description="FedAvg rounds before the one clustering round (Briggs et al. cluster after a "
                    "fixed number of FedAvg rounds n; 10 here)")
    distance_threshold: float = Field(
        3.0, gt=0,
        description="cut the dendrogram where the merge distance exceeds this; its scale depends on the "
                    "model and local training (ignored when clusters is given)")
    threshold: Literal["absolute", "relative"] = Field(
        "absolute", description="absolute: distance_threshold is a distance between updates; relative: it is a "
                                "multiple of the mean norm of the updates being clustered (scale-free)")
    clusters: int | None = Field(
        None, ge=1, description="cut the dendrogram into this many clusters instead (overrides the threshold)")
    linkage: Literal["ward", "average", "complete", "single"] = Field(
        "ward", description="agglomeration linkage (the paper recommends ward)")
    metric: Literal["euclidean", "cosine", "cityblock"] = Field(
        "euclidean", description="distance between client updates (ward needs euclidean)")

    @model_validator(mode="after")
    def _ward_is_euclidean(self) -> "FLHCParams":
        if self.linkage == "ward" and self.metric != "euclidean":
            raise ValueError("ward linkage needs metric: euclidean")
        if self.threshold == "relative" and self.metric == "cosine":
            # cosine distances are scale-free already: scaling the cut by a norm would make it scale-dependent
            raise ValueError("threshold: relative needs metric: euclidean or cityblock (cosine distances have no scale)")
        return self

    def cut(self, mean_update_norm: float) -> dict[str, Any]:
        """How to cut the dendrogram, given the mean norm of the updates being clustered."""
        if self.clusters is not None:
            return {"n_clusters": self.clusters}
        scale = mean_update_norm if self.threshold == "relative" else 1.0
        return {"distance_threshold": self.distance_threshold * scale}


def _flhc_starts(hp: FLHCParams) -> tuple[str, int]:
    return "cluster_round", hp.cluster_round


declare("flhc", FLHCParams, "cflpipe.methods.flhc:FLHC",
        Capabilities(clustered=True, k_param="clusters", pairs="the Euclidean distance of every pair of clients' updates (Ward's linkage, once)", pair_bytes=8), _flhc_starts, cluster_options("flhc"), family="clustered", variant_family="modifier",
        at_scale="its one clustering trains every client and links all N updates pairwise (Ward): 70 s that round, 3.7 GiB")
