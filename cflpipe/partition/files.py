"""A partition's files: clients.parquet, stats.parquet and the label histogram, written and
read back."""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from cflpipe.errors import PartitionError
from cflpipe.store import read_parquet, write_bytes, write_parquet
from cflpipe.partition.base import DRIFT_FILE, WEIGHT_PREFIX, FILES, PUBLIC_FILE, Partition


# --------------------------------------------------------------------------- files


# Fewer test samples than this make a client's accuracy coarse (steps of over 10 %): said when
# the partition is written and in the report's scenario overview.
SMALL_TEST_SET = 10


def small_test_sets(stats: pd.DataFrame, minimum: int = SMALL_TEST_SET) -> str | None:
    """One line when some clients hold fewer than `minimum` test samples, else None. In a
    user-level split (some clients never train) the training clients hold no test samples by
    design and are left out."""
    n_test = stats["n_test"].to_numpy()
    if "n_train" in stats and (stats["n_train"].to_numpy() == 0).any():
        n_test = n_test[stats["n_train"].to_numpy() == 0]
    small = n_test < minimum
    if not small.any():
        return None
    fewest = int(n_test.min())
    step = f", one sample is {100 / fewest:.0f} % of that client's accuracy" if fewest else \
        " (no accuracy at all for that client)"
    return (f"{int(small.sum())} of {len(n_test)} clients have fewer than {minimum} test samples (fewest: "
            f"{fewest}{step}); their per-client accuracies are coarse. More data per client (test_fraction, "
            f"dirichlet min_size, quantity min) gives finer ones")


def small_validation_sets(stats: pd.DataFrame, minimum: int = SMALL_TEST_SET) -> str | None:
    """One line when the scenario has a validation split and some clients hold fewer than
    `minimum` validation samples (a client without training data has none by design), else None."""
    if "n_val" not in stats:
        return None
    n_val = stats["n_val"].to_numpy()[(stats["n_train"] + stats["n_val"]).to_numpy() > 0]
    small = n_val < minimum
    if not small.any():
        return None
    return (f"{int(small.sum())} of {len(n_val)} clients have fewer than {minimum} validation samples (fewest: "
            f"{int(n_val.min())}); the validation accuracy that picks the best round is coarse for them. A larger "
            f"validation_fraction or more data per client gives a finer one")


def write_partition(partition: Partition, out_dir: str | Path, title: str | None = None) -> None:
    """Write clients.parquet, stats.parquet and label_hist.png. Everything is prepared in memory
    first and each file is renamed into place, so an error leaves no new or half-written file."""
    out = Path(out_dir)
    clients = pa.Table.from_pandas(partition.clients, preserve_index=False)
    stats = pa.Table.from_pandas(partition.stats, preserve_index=False)
    png = label_heatmap_png(partition, title)
    public = None if partition.public is None else \
        pa.Table.from_pandas(pd.DataFrame({"sample": partition.public}), preserve_index=False)
    write_parquet(out / "clients.parquet", clients)
    write_parquet(out / "stats.parquet", stats)
    write_bytes(out / "label_hist.png", png)
    moves = None if partition.moves is None else pa.Table.from_pandas(partition.moves, preserve_index=False)
    for name, table in ((PUBLIC_FILE, public), (DRIFT_FILE, moves)):
        if table is not None:
            write_parquet(out / name, table)
        elif (out / name).exists():
            (out / name).unlink()  # left over from an earlier definition of the scenario


def load_partition(out_dir: str | Path) -> Partition:
    out = Path(out_dir)
    for name in FILES[:2]:
        if not (out / name).is_file():
            raise PartitionError(f"{out / name}: partition file is missing; run the partition step first")
    clients = read_parquet(out / "clients.parquet")
    stats = read_parquet(out / "stats.parquet")
    num_classes = sum(1 for column in stats.columns if column.startswith("label_"))
    top_group = int(stats["group"].max()) if len(stats) else -1
    public = None
    if (out / PUBLIC_FILE).is_file():
        public = read_parquet(out / PUBLIC_FILE)["sample"].to_numpy(np.int64)
    weight_columns = [column for column in stats.columns if column.startswith(WEIGHT_PREFIX)]
    weights = stats[weight_columns].to_numpy(np.float64) if weight_columns else None
    groups = len(weight_columns) if weight_columns else top_group + 1
    moves = read_parquet(out / DRIFT_FILE) if (out / DRIFT_FILE).is_file() else None
    if moves is not None and len(moves):  # a client's move may take it to a group no client starts in
        groups = max(groups, int(moves["group"].max()) + 1)
    return Partition(clients, stats, num_classes, groups, public, weights, moves)


# A picture for people (mutation testing leaves it out: no figure a run computes depends on it).
def label_heatmap_png(partition: Partition, title: str | None = None) -> bytes:  # pragma: no mutate block
    # The object API with an explicit Agg canvas avoids pyplot's global state and backend choice.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    stats = partition.stats.sort_values(["group", "client"], kind="stable")
    counts = stats[[f"label_{k}" for k in range(partition.num_classes)]].to_numpy()
    figure = Figure(figsize=(7, 6), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    image = axes.imshow(counts, aspect="auto", interpolation="nearest", cmap="viridis")
    figure.colorbar(image, ax=axes, label="samples (train + test)")
    groups = stats["group"].to_numpy()
    for boundary in np.flatnonzero(np.diff(groups)):
        axes.axhline(boundary + 0.5, color="white", linewidth=0.8)
    if len(stats) <= 40:
        axes.set_yticks(np.arange(len(stats)), [str(c) for c in stats["client"]], fontsize=6)
    if partition.num_classes <= 20:
        axes.set_xticks(np.arange(partition.num_classes))
    axes.set_xlabel("label seen by the client")
    axes.set_ylabel("client (sorted by group)" if partition.groups else "client")
    groups_text = f", {partition.groups} groups" if partition.groups else ""
    axes.set_title(title or f"Label counts per client ({partition.num_clients} clients, "
                            f"{partition.num_classes} classes{groups_text})")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", metadata={"Software": None})
    return buffer.getvalue()
