"""Server-side clustering tools shared by the clustered methods (IFCA, CFL, FL+HC, FeSEM, FedGroup,
later FedAC), so each method states *what* it clusters and none re-implements *how*.

Every function is pure: it takes a (clients × parameters) matrix of model or update vectors (torch
tensors; numpy arrays are accepted and converted), returns labels as an int64 numpy array and
never touches global random state. Where randomness is involved it comes from an explicit
`seed` (an int or a `numpy.random.Generator`), so the same inputs and seed give the same output —
which is what lets a resumed run redraw exactly what an uninterrupted one drew.

Heavy lifting is done on whole matrices (`torch.cdist`, one `matmul` per similarity matrix, one SVD)
rather than Python loops over clients or parameters. Hierarchical clustering uses
scipy.cluster.hierarchy on the small (clients × clients) distance matrices only; scipy is imported
where it is used, so the many methods that never call it do not pay for loading it in every job.

`engine` holds k-means, the nearest center and the matrix helpers; `tools` the per-method tools
built on them. Import from the package; the modules are its layout, not its interface.
"""

from cflpipe.clustering.engine import (KMeansResult, as_matrix, canonical_labels, kmeans, nearest_center,
                                       pairwise_sq_distances)
from cflpipe.clustering.tools import (PCAProjection, cfl_bipartition, cosine_similarity_matrix, cut_dendrogram,
                                      dbscan_precomputed, decomposed_cosine_similarity, fcca_similarity, fit_pca,
                                      hierarchical_clusters, hopkins, js_divergence_matrix, principal_directions)

__all__ = [
    "KMeansResult", "PCAProjection", "as_matrix", "canonical_labels", "cfl_bipartition", "cut_dendrogram",
    "cosine_similarity_matrix", "dbscan_precomputed", "decomposed_cosine_similarity", "fcca_similarity", "fit_pca",
    "hierarchical_clusters", "hopkins", "js_divergence_matrix", "kmeans", "nearest_center", "pairwise_sq_distances",
    "principal_directions",
]
