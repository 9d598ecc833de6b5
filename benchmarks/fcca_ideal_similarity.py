"""FCCA's similarity D (Eq. 4) with ideal cINNs: does it find label-exchange groups under
Dirichlet label skew once every client's conditionals p(z | y) are learnt? (Fidelity IV, issue #56.)

One 2NN encoder is trained centrally on the whole data set; each client's "cINN" inverts
perfectly: c_i⁻¹(ε; y) is a resample of the client's own encoder features of label y, under its
group's label permutation (a label the client lacks gives the shared noise ε itself, the UNKNOWN
label's tie to N(0, I)). D is the project's `fcca_similarity` (the `mean` cosine, P included) and
the k-means FCCA runs on D's centred rows. Printed per partition draw: the ARI of the groups in
each noise draw, for D, for D without P (B alone), and for a D that pools each client's features
over its labels (what its data looks like, not what each label looks like).

    python benchmarks/fcca_ideal_similarity.py synthetic      # LEAF Synthetic, 100 devices
    python benchmarks/fcca_ideal_similarity.py mnist1d --clients 30
    python benchmarks/fcca_ideal_similarity.py digits --clients 24 --groups 3
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from sklearn.metrics import adjusted_rand_score

from cflpipe.clustering import fcca_similarity, kmeans
from cflpipe.data import load_dataset
from cflpipe.fl.local import sgd
from cflpipe.fl.params import ParamSpace
from cflpipe.models import MLP

CLASSES = 10


def dirichlet_swap(y: np.ndarray, clients: int, groups: int, alpha: float, rng: np.random.Generator):
    """Dirichlet(alpha) label split, then groups by client index; group 0 keeps the labels, every
    other group its own random full permutation (the project's label_swap)."""
    shares = [[] for _ in range(clients)]
    for label in range(CLASSES):
        where = rng.permutation(np.flatnonzero(y == label))
        cuts = (np.cumsum(rng.dirichlet([alpha] * clients)) * len(where)).astype(int)[:-1]
        for client, part in enumerate(np.split(where, cuts)):
            shares[client] += part.tolist()
    group = np.arange(clients) % groups
    permutations = [np.arange(CLASSES)] + [rng.permutation(CLASSES) for _ in range(groups - 1)]
    return [np.array(s, dtype=np.int64) for s in shares], group, permutations


def reconstructions(z, y, shares, group, permutations, samples: int, seed: int, pooled: bool = False):
    generator = torch.Generator().manual_seed(seed)
    noise = torch.randn(2, samples, z.shape[1], generator=generator)
    out = torch.empty(2, len(shares), CLASSES, samples, z.shape[1])
    for client, share in enumerate(shares):
        labels = torch.from_numpy(permutations[group[client]])[y[share]]
        for label in range(CLASSES):
            own = z[share] if pooled else z[share][labels == label]
            for draw in range(2):
                out[draw, client, label] = (own[torch.randint(len(own), (samples,), generator=generator)]
                                            if len(own) else noise[draw])
    return out[0], out[1]


def without_p(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    a, b = first.mean(2), second.mean(2)
    a, b = a / a.norm(dim=-1, keepdim=True), b / b.norm(dim=-1, keepdim=True)
    return torch.einsum("iyd,jyd->yij", a, b).double().mean(0)


def found(d: torch.Tensor, group: np.ndarray, k: int) -> float:
    return adjusted_rand_score(group, kmeans(d - d.mean(dim=1, keepdim=True), k, seed=0, init="k-means++").labels)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset", help="an embedded data set: digits, mnist1d, synthetic")
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--groups", type=int, default=5)
    parser.add_argument("--alpha", type=float, default=0.5)
    parser.add_argument("--encoder-steps", type=int, default=2000)
    parser.add_argument("--partitions", type=int, default=2, help="partition draws")
    parser.add_argument("--draws", type=int, default=3, help="noise draws per partition")
    parser.add_argument("--data-dir", default="data")
    args = parser.parse_args()
    torch.set_num_threads(1)
    options = {"devices": 100} if args.dataset == "synthetic" else {}
    data = load_dataset(args.dataset, options, args.data_dir)
    x = torch.tensor(data.x_train, dtype=torch.float32).flatten(1)
    x = (x - x.mean(0)) / (x.std(0) + 1e-6)
    y = torch.tensor(data.y_train)
    torch.manual_seed(0)
    encoder = MLP((x.shape[1],), CLASSES, hidden=200)
    sgd(ParamSpace(encoder), x, y, steps=args.encoder_steps, batch_size=64, lr=0.05,
        generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        z = encoder.features(x)
        accuracy = (encoder(x).argmax(1) == y).float().mean().item()
    print(f"{args.dataset}: encoder training accuracy {accuracy:.3f}, features {tuple(z.shape)}; "
          f"{args.clients} clients, {args.groups} groups, Dirichlet {args.alpha}")
    print("partition  ARI of D per noise draw | without P | pooled over labels")
    for partition in range(args.partitions):
        shares, group, permutations = dirichlet_swap(y.numpy(), args.clients, args.groups, args.alpha,
                                                     np.random.default_rng(partition))
        rows = {"D": [], "no P": [], "pooled": []}
        for draw in range(args.draws):
            first, second = reconstructions(z, y, shares, group, permutations, 32, draw)
            rows["D"].append(found(fcca_similarity(first, second, cosine="mean"), group, args.groups))
            rows["no P"].append(found(without_p(first, second), group, args.groups))
            first, second = reconstructions(z, y, shares, group, permutations, 32, draw, pooled=True)
            rows["pooled"].append(found(fcca_similarity(first, second, cosine="mean"), group, args.groups))
        print(f"{partition:9d}  " + " | ".join(" ".join(f"{a:.2f}" for a in v) for v in rows.values()))


if __name__ == "__main__":
    main()
