"""Whether a client is placed with its true group: shared by the axes that ask it (new clients
against the participants, moved clients against the clients that never move)."""

from __future__ import annotations

import numpy as np


def with_their_group(held: np.ndarray, held_groups: np.ndarray, clusters: np.ndarray,
                     groups: np.ndarray) -> np.ndarray:
    """For each (cluster, true group) pair: 1.0 where the cluster holds most of the clients of
    `held` (their clusters; −1: in none) whose true group (`held_groups`) it is, or as many as
    the cluster that holds most (a tie: each such cluster is the group's), 0.0 where another holds
    more, NaN where that cannot be said (the cluster −1, no clustered client
    of the group, or one cluster for all: being in it says nothing). New clients against the
    participants (newcomers.joined), moved clients against those that never move (drift.report)."""
    out = np.full(len(clusters), np.nan)
    if len(np.unique(held[held >= 0])) < 2:
        return out
    for i, (cluster, group) in enumerate(zip(clusters, groups)):
        members = held[(held_groups == group) & (held >= 0)]
        if len(members) and cluster >= 0:
            values, counts = np.unique(members, return_counts=True)
            out[i] = float(counts[values == cluster].sum() == counts.max())
    return out
