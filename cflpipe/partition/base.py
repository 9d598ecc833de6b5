"""The partition's record (`Partition`) and the names its files and transforms share."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd



NO_TRANSFORM = "none"
# A mixture client's transform in stats.parquet: each of its samples has its own (clients.parquet).
MIXED = "mixture"
# stats.parquet's columns of a mixture client's ground-truth group weights: weight_0, weight_1, …
WEIGHT_PREFIX = "weight_"
FILES = ("clients.parquet", "stats.parquet", "label_hist.png")
# The values of clients.parquet's `split`, in the order of a client's rows ("val" only with a
# scenario's validation_fraction).
SPLITS = ("train", "test", "val")
# The server's public samples (scenario `public:`), when the scenario has them.
PUBLIC_FILE = "public.parquet"
# The clients' moves to other groups (scenario `drift`), when the scenario has them.
DRIFT_FILE = "drift.parquet"


@dataclass(frozen=True)
class Partition:
    """`clients`: one row per (client, sample) sorted by client, train before test before val, sample;
    columns client int32, split 'train'|'test'|'val', sample int64 (pool index), group int32 (the
    client's ground-truth group; -1 without one), transform str (the sample's: a mixture
    client's samples each have their own), label int64 (the label the client sees), and in a
    mixture scenario component int32 (the ground-truth group the sample was drawn from).
    `stats`: one row per client: client, group, transform (MIXED for a mixture client), n_train,
    n_test, n_val (with a validation split only), label_0..label_{C-1}, and in a mixture scenario weight_0..weight_{G-1} (the drawn
    weights of the ground-truth groups)."""

    clients: pd.DataFrame
    stats: pd.DataFrame
    num_classes: int
    groups: int
    # Indices into the dataset's test split of the samples the server holds unlabeled (None: none).
    public: np.ndarray | None = None
    # A mixture scenario's (clients × ground-truth groups) weights each client's samples were
    # drawn with (None: every client is one group's).
    weights: np.ndarray | None = None
    # Scenario `drift`'s moves, in order: round int32 (the first round trained after the move),
    # client int32, group int32 (its ground-truth group from then on), transform str (None: no drift).
    moves: pd.DataFrame | None = None

    @property
    def num_clients(self) -> int:
        return len(self.stats)

    def transform_of(self, client: int) -> str:
        return str(self.stats["transform"].iat[client])
