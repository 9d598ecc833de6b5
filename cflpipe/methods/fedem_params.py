"""FedEM and FedRC: hyper-parameters and declaration, torch-free so that `validate` and `cflpipe
methods` read them without importing `cflpipe.methods.fedem`, which implements it."""

from __future__ import annotations

from pydantic import Field

from cflpipe.registry import Capabilities, HyperParams, declare


class FedEMParams(HyperParams):
    # Named `clusters` as every method's K, so that a scenario's `hyperparams: {clusters: K}`
    # reaches it (and FedAC's PCA `components` stays apart).
    clusters: int = Field(3, ge=1, description="K: mixture components, one shared model each (the authors' "
                                                 "experiments: 3)")


declare("fedem", FedEMParams, "cflpipe.methods.fedem:FedEM",
        Capabilities(clustered=True, personalized=True, k_param="clusters", soft=True), family="clustered")


declare("fedrc", FedEMParams, "cflpipe.methods.fedem:FedRC",
        Capabilities(clustered=True, personalized=True, k_param="clusters", soft=True), family="clustered")
