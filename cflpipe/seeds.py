"""All randomness of a run is derived from keys of ints (run seed, round, client, purpose…), never
from a stream carried across rounds, so a resumed run draws what an uninterrupted one would. The
three ways a key becomes randomness, in one place:

- `rng(*key)`: a NumPy generator (server and client draws: sampling, k-means starts, public batches);
- `mix_seed(*key)`: one 63-bit int for torch's seeds (batch streams, dropout, FCCA's noise);
- `seed32(*key)`: one 32-bit int (model initializations of IFCA's extra cluster models).

Each is a pure function of the key; purposes are distinct constants in the modules that draw."""

from __future__ import annotations

import numpy as np


def rng(*key: int) -> np.random.Generator:
    return np.random.default_rng(list(key))


def mix_seed(*key: int) -> int:
    return int(np.random.SeedSequence(list(key)).generate_state(1, dtype=np.uint64)[0] >> 1)


def seed32(*key: int) -> int:
    return int(np.random.SeedSequence(list(key)).generate_state(1)[0])
