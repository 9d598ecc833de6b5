"""FedEM and FedRC placing a new client with its mixture weights fitted to convergence: a
diagnostic for #69 item 5, not a method (docs/new-clients.md, "FedEM, FedRC and FedGMM: which fit
of a new client's weights").

Each method's own rule (`FedEM.new_client_weights`, asked by `fedem.asked_weights`, the question
"weights") gives a new client one E-step of its mixture weights π and their mean, from the π it kept
at the last placement (uniform at the first), on its training data: the authors' rule, one step per
evaluation. These subclasses iterate that E-step and π ← the mean responsibilities, the components
fixed, until π moves by less than 1e-8 (at most 1,000 steps): the EM fit of an unseen client's
weights with the components held.

    PYTHONPATH=benchmarks cflpipe train --config benchmarks/newcomers_em_converged.yaml \\
        --scenario swap-new --method fedem fedem_converged fedrc fedrc_converged --seed 0 1 2
"""

from __future__ import annotations

import numpy as np

from cflpipe.methods import register
from cflpipe.methods.fedem import FedEM, FedRC
from cflpipe.methods.fedem_params import FedEMParams

TOLERANCE, MOST_STEPS = 1e-8, 1000


class _Converged:
    @classmethod
    def new_client_weights(cls, payload, pi, losses, labels):
        for _ in range(MOST_STEPS):
            new = cls.responsibilities_of(payload, pi, losses, labels).mean(axis=1)
            done = np.abs(new - pi).max() < TOLERANCE
            pi = new
            if done:
                break
        return pi


@register("fedem_converged", FedEMParams)
class FedEMConverged(_Converged, FedEM):
    """FedEM, a new client's mixture weights fitted to convergence (a diagnostic)."""


@register("fedrc_converged", FedEMParams)
class FedRCConverged(_Converged, FedRC):
    """FedRC, a new client's mixture weights fitted to convergence (a diagnostic)."""
