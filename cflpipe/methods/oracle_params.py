"""The oracle: its declaration, torch-free so that `validate` and `cflpipe methods` read it without
importing `cflpipe.methods.oracle`, which implements it."""

from __future__ import annotations

from cflpipe.methods.intercluster_params import cluster_options
from cflpipe.registry import Capabilities, HyperParams, declare


declare("oracle", HyperParams, "cflpipe.methods.oracle:Oracle",
        Capabilities(needs_groups=True, clustered=True), variants=cluster_options("oracle"), family="reference",
        variant_family="modifier")
