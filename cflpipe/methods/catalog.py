"""The built-in methods, declared: each method module `X.py` has a torch-free sibling
`X_params.py` that states its hyper-parameters (a pydantic model, validated up front), capabilities,
variants, the round its clustering may start in, its premises and the class that implements it;
what a method is, in a sentence, is the first paragraph of its class docstring, read from its source
without importing it (`registry.class_summary`). This index imports every sibling, so validating a
spec (`cflpipe validate`, the workflow's first step) and listing methods declare every built-in
without importing torch; a method's own module is imported when a run needs its class, which is
bound to its declaration as it is defined (`registry.bind_declared`).

A new built-in method adds its `X_params.py` beside its module and one name here."""

from __future__ import annotations

from cflpipe.methods import (  # noqa: F401 (each declares its methods as it is imported)
    cfl_params, cflgp_params, cgpfl_params, ditto_params, fcca_params, fedac_params, fedavg_params,
    fedem_params, fedgmm_params, fedgroup_params, fedper_params, fedprox_params, fedsoft_params,
    fedtsdp_params, fesem_params, flhc_params, flux_params, icfl_params, ifca_params, intercluster_params,
    kmeans_cfl_params, lcfed_params, local_params, oracle_params, pacfl_params, perfedavg_params,
    srfca_params, stocfl_params,
)
