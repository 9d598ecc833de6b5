"""LCFed (Zhang, Chen, Lin, Chen and Zhao, "LCFed: An Efficient Clustered Federated Learning
Framework for Heterogeneous Data", ICASSP 2025, arXiv 2501.01850), reconstructed from its
abstract and from FedAC (seed paper 000, by the same authors), whose machinery it runs: only
LCFed's abstract and introduction could be read here, so cflpipe labels it for what it is;
docs/methods-reconstructed.md says what is known and what is guessed."""

from __future__ import annotations

from cflpipe.methods.fedac import FedAC


class LCFed(FedAC):
    """LCFed (reconstructed from its abstract and FedAC): FedAC's global embedding, cluster centers and LrCos re-clustering every round, with no cluster-number tuning (K as given, or fewer).

    LCFed (Zhang et al., ICASSP 2025, by FedAC's authors) could be read here only as far as its
    abstract and introduction: model partitioning into a shared embedding and cluster-wise
    decision layers, and PCA low-rank cosine similarity for re-clustering every round. Those are
    FedAC's machinery, which this runs unchanged; what the abstract does not list, FedAC's
    cluster-number tuning, is left out: no cluster is ever added, and one that loses every member
    is dropped, as in FedAC, so K is at most the given one. Everything its method section would
    settle (whether clients keep personal models across rounds, what the PCA is fitted on and
    how often, the initial centers, μ, λ, D) is FedAC's reading here; docs/methods-reconstructed.md
    lists the guesses."""

    tunes_cluster_number = False

    @classmethod
    def check_hyperparams(cls, params):
        return {"components": 2}
