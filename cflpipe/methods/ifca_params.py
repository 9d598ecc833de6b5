"""IFCA: hyper-parameters and declaration, torch-free so that `validate` and `cflpipe methods` read
them without importing `cflpipe.methods.ifca`, which implements it."""

from __future__ import annotations

from pydantic import Field

from cflpipe.methods.intercluster_params import cluster_options
from cflpipe.registry import Capabilities, HyperParams, declare


class IFCAParams(HyperParams):
    clusters: int = Field(2, ge=1, description="number of cluster models K (the paper's k; 2 by default, "
                                               "set it to the expected number of groups)")
    restarts: int = Field(1, ge=1, le=20, description="random initializations of the K models trained side by "
                                                      "side for `restart_rounds` rounds, the best then kept (the "
                                                      "paper's remedy for a bad start; 1: Algorithm 1 alone)")
    restart_rounds: int = Field(5, ge=1, description="rounds the restarts train side by side before the one "
                                                     "with the lowest training loss is kept")


declare("ifca", IFCAParams, "cflpipe.methods.ifca:IFCA",
        Capabilities(clustered=True, k_param="clusters"), variants=cluster_options("ifca"), family="clustered", variant_family="modifier")
