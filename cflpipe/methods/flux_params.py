"""FLUX: hyper-parameters, first clustering round and declaration, torch-free so that `validate` and
`cflpipe methods` read them without importing `cflpipe.methods.flux`, which implements it."""

from __future__ import annotations

from pydantic import Field

from cflpipe.methods.intercluster_params import cluster_options
from cflpipe.registry import Capabilities, HyperParams, declare


class FLUXParams(HyperParams):
    th_round: float = Field(0.06, ge=0, description="cluster once the weighted accuracy of the global model on "
                                                    "the round's clients has risen by less than this in some round "
                                                    "(the authors' th_round 0.06), checked from the fourth round")
    max_round_fraction: float = Field(0.8, gt=0, le=1, description="cluster by this share of the rounds at the "
                                                                   "latest (the authors' 0.8)")
    cluster_round: int | None = Field(None, ge=0, description="cluster in this round (0-based) instead of by the "
                                                              "trigger (the authors' simulated path: 4)")
    eps_scaling: float = Field(1.0, gt=0, description="DBSCAN's eps is the knee of the sorted nearest-neighbour "
                                                      "distances times this (the authors' 1.0)")
    projection_points: int = Field(200, ge=2, description="random points the shared PCA projection of the features "
                                                          "is fitted on (the authors' 200)")


def _flux_starts(hp: FLUXParams) -> tuple[str, int]:
    # The trigger reads three gains first: the clustering is in round 3 (0-based) at the earliest.
    return ("cluster_round", hp.cluster_round) if hp.cluster_round is not None else ("th_round", 3)


declare("flux", FLUXParams, "cflpipe.methods.flux:FLUX",
        Capabilities(clustered=True), _flux_starts, cluster_options("flux"), family="clustered",
        variant_family="modifier")
