"""PACFL: hyper-parameters, premises and declaration, torch-free so that `validate` and `cflpipe
methods` read them without importing `cflpipe.methods.pacfl`, which implements it."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from cflpipe.methods.intercluster_params import cluster_options
from cflpipe.registry import Capabilities, HyperParams, declare


class PACFLParams(HyperParams):
    basis: int = Field(3, ge=1, description="p: left singular vectors kept per label of a client's data "
                                            "(the authors' scripts: 3)")
    threshold: float = Field(4.9, gt=0, description="merge clusters while their proximity (degrees) is at most this "
                                                    "(the authors' CIFAR-10 script: 4.9; angles depend on the data, "
                                                    "see pacfl_angle_* in rounds.parquet)")
    clusters: int | None = Field(None, ge=1, description="cut into this many clusters instead of at the threshold")
    linkage: Literal["average", "maximum", "minimum"] = Field(
        "average", description="the authors' names: average (WPGMA, their default), maximum (complete), "
                               "minimum (single)")


def _pacfl_premises(hp: PACFLParams, training: Any, scenario: Any) -> list[tuple[str, str]]:
    truth = [step.kind for step in scenario.group_steps() if step.ground_truth]
    if not truth or set(truth) != {"label_swap"}:
        return []
    return [("", "PACFL compares the subspaces of each label's inputs, not which label an input has: label-swap "
                 "groups hold the same inputs, so it cannot tell them apart (ARI about 0 on the robustness map); "
                 "its figures there are those of an arbitrary clustering")]


declare("pacfl", PACFLParams, "cflpipe.methods.pacfl:PACFL",
        Capabilities(clustered=True, k_param="clusters", pairs="the principal angle of every pair of clients' subspaces (the proximity matrix A: kept, and symmetrized for the dendrogram); cflpipe writes it at each evaluation as a long table of every pair of the clients full evaluations read (training.full_eval_clients)", pair_bytes=28, pair_rows_bytes=100), variants=cluster_options("pacfl"), premises=_pacfl_premises,
        needs="groups that differ in their inputs (rotation, flip, label skew); label swaps look alike to it",
        family="clustered", variant_family="modifier",
        at_scale="the proximity matrix of every pair of clients (float64, kept and symmetrized): 3.9 GiB")
