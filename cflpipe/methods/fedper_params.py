"""FedPer: its declaration, torch-free so that `validate` and `cflpipe methods` read it without
importing `cflpipe.methods.fedper`, which implements it."""

from __future__ import annotations

from cflpipe.registry import Capabilities, HyperParams, declare


declare("fedper", HyperParams, "cflpipe.methods.fedper:FedPer",
        Capabilities(personalized=True), family="personalized")
