"""SR-FCA: hyper-parameters and declaration, torch-free so that `validate` and `cflpipe methods` read
them without importing `cflpipe.methods.srfca`, which implements it."""

from __future__ import annotations

from pydantic import Field

from cflpipe.methods.intercluster_params import cluster_options
from cflpipe.registry import Capabilities, HyperParams, declare


class SRFCAParams(HyperParams):
    init_steps: int = Field(250, ge=1, description="local steps of each client's own model before the one-shot "
                                                   "clustering (the authors' MNIST configs: 250–280)")
    dist_fraction: float = Field(0.25, gt=0, le=1, description="λ: this quantile of the clients' pairwise "
                                                               "cross-entropy distances (the authors' fallback)")
    threshold: float | None = Field(None, gt=0, description="λ itself instead, a mean cross-entropy (the authors' "
                                                            "tuned values are on another scale and do not carry over)")
    size_threshold: int = Field(2, ge=0, description="t: groups of at most t clients dropped at the start, clusters "
                                                     "of fewer than t at each re-clustering (the authors' 2)")
    trim: float = Field(0.15, ge=0, lt=0.5, description="β of the trimmed mean: each coordinate's members' values "
                                                        "sorted, those of ranks [int(β·n), int((1 − β)·n)) averaged (the "
                                                        "authors' 0.15; named trim, as beta is AWCFL's in srfca_awcfl)")
    refine_steps: int = Field(2, ge=1, description="refinement steps: the rounds are cut into this many blocks, "
                                                   "each cluster trained afresh in each (the authors' 2)")


declare("srfca", SRFCAParams, "cflpipe.methods.srfca:SRFCA",
        Capabilities(clustered=True, pairs="every client's loss on every other client's model (float64), the threshold graph and the known pair distances for λ at its start", pair_bytes=13), variants=cluster_options("srfca"), family="clustered",
        variant_family="modifier",
        at_scale="its start scores every client's own model on every other client's data: N² evaluations, 150 s "
                 "at 1,000 clients (173× a training round), about 4 CPU-hours at 10,000 by N², so not run to the end "
                 "there; a block of clients at a time: 2,125 MiB at 3,000 clients, 2,985 over its first block at "
                 "10,000 (was past 8 GiB)")
