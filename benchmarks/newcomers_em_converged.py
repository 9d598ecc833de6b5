"""FedEM and FedRC placing a new client with its mixture weights fitted to convergence: a
diagnostic for #69 item 5, not a method (docs/new-clients.md, "Each method's rule").

Each method's own rule places a new client (scenario new_clients) with one E-step of its mixture
weights π from uniform ones, on its training data (`fedem.asked_weights`, the question
"weights"). These subclasses answer the same question by iterating that E-step and π ← the mean
responsibilities, the components fixed, until π moves by less than 1e-8 (at most 1,000 steps):
the EM fit of an unseen client's weights with the components held. The authors' FedEM code
(github.com/omarfoq/FedEM, aggregator.update_test_clients) runs one E-step and one π update per
evaluation on its test clients, their π kept from one evaluation to the next.

    PYTHONPATH=benchmarks cflpipe train --config benchmarks/newcomers_em_converged.yaml \\
        --scenario swap-new --method fedem fedem_converged fedrc fedrc_converged --seed 0 1 2
"""

from __future__ import annotations

import numpy as np
import torch

from cflpipe.methods import register
from cflpipe.methods.fedem import FedEM, FedRC
from cflpipe.methods.fedem_params import FedEMParams
from cflpipe.methods.ifca import sample_losses

TOLERANCE, MOST_STEPS = 1e-8, 1000


class _Converged:
    @classmethod
    def query(cls, view, payload, trained, scratch):
        if payload.meta.get("question") != "weights":
            return super().query(view, payload, trained, scratch)
        x, y = view.data()
        kept = view.kept("pi")
        if not len(y):
            return view.answer({})
        losses, labels = sample_losses(view.apply, payload.tensors["models"], x, y), y.cpu().numpy()
        pi = kept.cpu().numpy()
        for _ in range(MOST_STEPS):
            new = cls.responsibilities_of(payload, pi, losses, labels).mean(axis=1)
            done = np.abs(new - pi).max() < TOLERANCE
            pi = new
            if done:
                break
        return view.answer({}, keep={"pi": torch.as_tensor(pi, dtype=kept.dtype, device=kept.device)})


@register("fedem_converged", FedEMParams)
class FedEMConverged(_Converged, FedEM):
    """FedEM, a new client's mixture weights fitted to convergence (a diagnostic)."""


@register("fedrc_converged", FedEMParams)
class FedRCConverged(_Converged, FedRC):
    """FedRC, a new client's mixture weights fitted to convergence (a diagnostic)."""
