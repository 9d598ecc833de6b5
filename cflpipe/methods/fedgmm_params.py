"""FedGMM: hyper-parameters and declaration, torch-free so that `validate` and `cflpipe methods` read
them without importing `cflpipe.methods.fedgmm`, which implements it."""

from __future__ import annotations

from pydantic import Field

from cflpipe.registry import Capabilities, HyperParams, declare


class FedGMMParams(HyperParams):
    # Named `clusters` as every method's K (the classifiers carry the concept shift a scenario's
    # groups are made of), so that a scenario's `hyperparams: {clusters: K}` reaches it.
    clusters: int = Field(3, ge=1, description="M2: shared classifiers (the authors' n_learners: 3)")
    gmm_components: int = Field(3, ge=1, description="M1: Gaussian components of the embedded inputs (the "
                                                     "authors' n_gmm: 3)")
    embedding: int = Field(32, ge=1, description="dimensions of the inputs' embedding the Gaussians live on (the "
                                                 "authors' embedding_dimension: 32; at most the input size)")
    covariance_floor: float = Field(0.1, gt=0, description="added to each Gaussian's covariance diagonal (the "
                                                           "authors' eps: 0.1)")


declare("fedgmm", FedGMMParams, "cflpipe.methods.fedgmm:FedGMM",
        Capabilities(clustered=True, personalized=True, k_param="clusters", soft=True), family="clustered")
