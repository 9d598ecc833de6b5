"""FedAC: hyper-parameters and declaration, torch-free so that `validate` and `cflpipe methods` read
them without importing `cflpipe.methods.fedac`, which implements it."""

from __future__ import annotations

from pydantic import Field, model_validator

from cflpipe.methods.lcfed_params import LCFedParams
from cflpipe.registry import Capabilities, declare


class FedACParams(LCFedParams):
    clusters: int = Field(2, ge=1, description="initial number of clusters K (CNT tunes it)")
    cnt: bool = Field(True, description="cluster-number tuning on/off (ablation)")
    cnt_low: float = Field(0.2, ge=0, description="CNT lower threshold a: G < a merges")
    cnt_high: float = Field(0.8, gt=0, description="CNT upper threshold b: G > b splits")
    cnt_start: int = Field(5, ge=0, description="rounds before CNT may act")
    max_clusters: int = Field(20, ge=1, description="CNT never splits beyond this many clusters")

    @model_validator(mode="after")
    def _thresholds_ordered(self) -> "FedACParams":
        if self.cnt_low > self.cnt_high:
            raise ValueError(f"cnt_low ({self.cnt_low}) must be <= cnt_high ({self.cnt_high}): G < cnt_low merges, "
                             f"G > cnt_high splits")
        return self


declare("fedac", FedACParams, "cflpipe.methods.fedac:FedAC",
        Capabilities(clustered=True, personalized=True, k_param="clusters"), family="seed",
        at_scale="the M-step and CNT read every client's ω_i each round: server 15× its training; 3,140 MiB")
