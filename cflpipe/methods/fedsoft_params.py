"""FedSoft: hyper-parameters and declaration, torch-free so that `validate` and `cflpipe methods` read
them without importing `cflpipe.methods.fedsoft`, which implements it."""

from __future__ import annotations

from pydantic import Field

from cflpipe.registry import Capabilities, HyperParams, declare


class FedSoftParams(HyperParams):
    clusters: int = Field(2, ge=1, description="S: number of cluster models (the authors' experiments: the number "
                                               "of true distributions)")
    lam: float = Field(0.1, ge=0, description="λ: strength of the pull of a local model to the centers (the "
                                              "authors' code: 0.1 on MNIST and EMNIST, 0.01 on CIFAR-10)")
    estimation_interval: int = Field(2, ge=1, description="τ: rounds between two estimations of the importance "
                                                          "weights (the authors' main.py: 2)")
    smoother: float = Field(1e-4, gt=0, lt=1, description="σ: the share given to a cluster no sample matches, so "
                                                          "that every client keeps some weight in every center")


declare("fedsoft", FedSoftParams, "cflpipe.methods.fedsoft:FedSoft",
        Capabilities(clustered=True, personalized=True, k_param="clusters", soft=True), family="clustered")
