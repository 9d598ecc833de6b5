"""Ditto: hyper-parameters and declaration, torch-free so that `validate` and `cflpipe methods` read
them without importing `cflpipe.methods.ditto`, which implements it."""

from __future__ import annotations

from pydantic import Field

from cflpipe.registry import Capabilities, HyperParams, declare


class DittoParams(HyperParams):
    lam: float = Field(1.0, ge=0, description="λ: strength of the pull of each personal model towards the "
                       "round's global model (the authors' run scripts use 1; 0 = purely local personal models)")
    personal_steps: int | None = Field(None, ge=1, description="local SGD steps on the personal model per round "
                                       "(default: the same budget as the global model's local training)")


declare("ditto", DittoParams, "cflpipe.methods.ditto:Ditto",
        Capabilities(personalized=True), family="personalized")
