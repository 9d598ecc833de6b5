"""FedGroup: hyper-parameters and declaration, torch-free so that `validate` and `cflpipe methods` read
them without importing `cflpipe.methods.fedgroup`, which implements it."""

from __future__ import annotations

from pydantic import Field

from cflpipe.methods.intercluster_params import cluster_options
from cflpipe.registry import Capabilities, HyperParams, declare


class FedGroupParams(HyperParams):
    clusters: int = Field(3, ge=1, description="number of groups K (reference code default 3)")
    pretrain_scale: int = Field(20, ge=1, description="α: min(α·K, clients) clients pre-train for the "
                                                      "clustering (reference code: alpha=20)")
    pretrain_steps: int | None = Field(20, ge=1, description="local SGD steps of a pre-training (reference code: "
                                                             "20 iterations); null: the training block's budget")
    kmeans_iter: int = Field(20, ge=1, description="k-means iterations on the decomposed similarities "
                                                   "(reference code: max_iter=20)")
    kmeans_init: int = Field(10, ge=1, description="k-means++ restarts, lowest inertia kept (scikit-learn's "
                                                   "n_init=10 the reference code ran with)")


declare("fedgroup", FedGroupParams, "cflpipe.methods.fedgroup:FedGroup",
        Capabilities(clustered=True, k_param="clusters"), variants=cluster_options("fedgroup"), family="clustered", variant_family="modifier")
