"""Which clients a run trains and which a round samples: the clients with training samples (LEAF's
user-level split holds users only in the test files), and each round's seeded draw among those
present (scenario availability keeps some away)."""

from __future__ import annotations

import numpy as np

from cflpipe.errors import SpecError
from cflpipe.fl.data import FederatedData
from cflpipe.registry import Capabilities
from cflpipe.seeds import rng
from cflpipe.spec import Training


def training_clients(data: FederatedData, training: Training, capabilities: Capabilities, method: str,
                     scenario: str, per_round_key: str) -> np.ndarray | None:
    """The clients with training samples when some have none (LEAF's user-level split, kept
    with `holdout: dataset`), else None. Users who never train are evaluated with the model
    every client shares, so only methods with one global model can run such a scenario."""
    sizes = data.train.sizes()
    if (sizes > 0).all():
        return None
    training_ids = np.flatnonzero(sizes > 0)
    held_out = data.num_clients - len(training_ids)
    if capabilities.clustered or capabilities.personalized:
        kind = "its clusters' models" if capabilities.clustered else "models of their own"
        raise SpecError(f"methods.{method}: scenario {scenario} holds {held_out} clients that "
                        f"never train (users only in the dataset's test files, LEAF's user-level split); "
                        f"{method} evaluates clients with {kind}, so it has no model for them. "
                        f"Use a method with one global model (e.g. fedavg, fedprox), leave the scenario out "
                        f"of methods.{method}.scenarios, or use LEAF's sample-level split")
    if training.clients_per_round > len(training_ids):
        raise SpecError(f"{per_round_key}: {training.clients_per_round}, but scenario {scenario} has "
                        f"{len(training_ids)} clients with training samples ({held_out} only test); at most "
                        f"{len(training_ids)}")
    return training_ids


def sample(seed: int, round_index: int, k: int, num_clients: int, training_ids: np.ndarray | None,
           away: list[np.ndarray]) -> np.ndarray:
    """Round `round_index`'s (0-based) clients, sorted: k drawn by the run's seed and the round
    from the clients that train (`training_ids`; None: every client) less those `away` (the
    axes'), or all of those present where fewer are."""
    draw = rng(seed, round_index, 0x5A)
    if away:  # clients kept away this round (scenario availability): drawn from those present
        pool = np.arange(num_clients) if training_ids is None else training_ids
        present = np.setdiff1d(pool, np.concatenate(away))
        return np.sort(draw.choice(present, size=min(k, len(present)), replace=False))
    if training_ids is not None:  # held-out users never train
        return np.sort(draw.choice(training_ids, size=k, replace=False))
    return np.sort(draw.choice(num_clients, size=k, replace=False))
