"""What a clustered method's run did with its clusters, said after the run when it is not a
clustering a reader would take it for: FedAvg in disguise (one cluster throughout, or collapsed
to one by the end), Local in disguise (about one cluster per client at the end), or a gate that
never let it cluster. Read from the run's rounds table alone, so a run rebuilt from its tables
says the same. No torch."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

# "About one cluster per client": the final clusters are at least this share of the clients
# (mean cluster size below 1.25). CFL's 10 clusters for 18 clients are a clustering; 15 are not.
SINGLETON_SHARE = 0.8
# "Most clients alone": more than this share of the clients in clusters of one at the end
# (FedTSDP's 19 clusters for 24 clients: most alone, a few pairs; the share above missed it).
ALONE_SHARE = 0.5
# Below this many clients "one cluster each" and "a few clusters" are the same thing.
SINGLETON_MIN_CLIENTS = 4

ONE_CLUSTER, COLLAPSED, SINGLETONS, GATE = "one_cluster", "collapsed", "singletons", "gate"
KINDS = (ONE_CLUSTER, COLLAPSED, SINGLETONS, GATE)


@dataclass(frozen=True)
class Degeneration:
    kind: str   # one of KINDS
    line: str   # what the run did, for summary.json, the warning and the report

    def as_summary(self) -> dict[str, str]:
        return {"degenerate": self.line, "degenerate_kind": self.kind}


def diagnose_clustering(rounds: pd.DataFrame, clients: int, gate_note: str | None = None, true_groups: int = 0,
                        soft: bool = False, collapse_note: str | None = None) -> Degeneration | None:
    """The first of: a gate of the method's own that kept it from clustering (`gate_note`, its
    own line), never more than one cluster in an evaluated round, one cluster at the final
    evaluation after more before, several clusters served one model at the end (`collapse_note`,
    the method's own line), about one cluster per client or most clients alone in their
    cluster at the final evaluation (unless the scenario has as many `true_groups`). None for a
    run that ended with a clustering (or has no evaluated round). A `soft` method's clusters are its clients' largest shares: it still
    predicts with every component, so its lines say so rather than naming FedAvg or Local."""
    if gate_note is not None:
        return Degeneration(GATE, gate_note)
    counts = rounds["n_clusters"].dropna() if "n_clusters" in rounds else rounds[:0]
    if not len(counts):
        return None
    most, final = int(counts.max()), int(counts.iloc[-1])
    if most <= 1:
        return Degeneration(ONE_CLUSTER, "every client's largest share was in one component in every evaluated "
                                         "round" if soft else "never formed more than one cluster in an evaluated round")
    if final <= 1:
        rounds_with_more = rounds.loc[counts.index[counts > 1], "round"]
        before = f"it had {most} clusters; the last evaluated round with more than one was round " \
                 f"{int(rounds_with_more.iloc[-1])}"
        if soft:
            return Degeneration(COLLAPSED, f"collapsed by the end: every client's largest share is in one component "
                                           f"({before})")
        return Degeneration(COLLAPSED, f"collapsed to one cluster by the end ({before}): its final figures are those "
                                       f"of one model for all")
    if collapse_note is not None:
        return Degeneration(COLLAPSED, collapse_note)
    if clients < SINGLETON_MIN_CLIENTS or final <= true_groups:
        return None
    if final >= SINGLETON_SHARE * clients:
        if soft:
            return Degeneration(SINGLETONS, f"ended with about one component per client as largest share ({final} for "
                                            f"{clients} clients)")
        return Degeneration(SINGLETONS, f"ended with about one cluster per client ({final} clusters for {clients} "
                                        f"clients): its final figures are those of clients trained alone, Local")
    alone = rounds.loc[counts.index[-1], "singleton_clients"] if "singleton_clients" in rounds else None
    if alone is not None and not pd.isna(alone) and int(alone) > ALONE_SHARE * clients:
        if soft:
            return Degeneration(SINGLETONS, f"ended with most clients alone in their largest component ({int(alone)} "
                                            f"of {clients} clients, {final} components)")
        return Degeneration(SINGLETONS, f"ended with most clients in clusters of one ({int(alone)} of {clients} "
                                        f"clients alone, {final} clusters): their final figures are those of clients "
                                        f"trained alone, Local")
    return None
