"""Local training: its declaration, torch-free so that `validate` and `cflpipe methods` read it without
importing `cflpipe.methods.local`, which implements it."""

from __future__ import annotations

from cflpipe.registry import Capabilities, HyperParams, declare


declare("local", HyperParams, "cflpipe.methods.local:Local",
        Capabilities(personalized=True), family="baseline")
