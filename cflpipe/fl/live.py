"""A run's curves while it trains (`workflow: {live: true}`), as TensorBoard event files.

At every evaluation the run adds its headline figures (step = round) to
`RESULTS/live/SCENARIO/METHOD/seedK/`: `tensorboard --logdir RESULTS/live` draws every run of the
spec as it trains, one curve per run. The folder is a view, not an output: it sits outside the runs'
folders (no workflow tracks it, no run reads it), changes no other file, and holds wall-clock
times. A resumed run purges the steps from its checkpoint on (TensorBoard's purge_step), so the
rounds it trains again are drawn once. Off by default: importing TensorBoard's writer costs one to
three seconds per process.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

# rounds.parquet's figures a researcher watches: accuracy, the clustering, the training loss.
LIVE_FIGURES = ("acc_macro", "acc_micro", "val_acc_macro", "ari", "n_clusters", "train_loss")


def live_root(results_dir: str | Path) -> Path:
    """Where every run of a results folder writes its curves: TensorBoard's --logdir."""
    return Path(results_dir) / "live"


def live_dir(results_dir: str | Path, scenario: str, method: str, seed: int) -> Path:
    return live_root(results_dir) / scenario / method / f"seed{seed}"


class LiveCurves:
    def __init__(self, folder: Path, start_round: int):
        from torch.utils.tensorboard import SummaryWriter

        if start_round == 0:  # a run trained from its first round: an earlier attempt's curves go
            shutil.rmtree(folder, ignore_errors=True)
        self.writer = SummaryWriter(log_dir=str(folder), purge_step=start_round + 1 if start_round else None)

    def log(self, round_number: int, row: dict) -> None:
        for name in LIVE_FIGURES:
            value = row.get(name)
            if isinstance(value, (int, float)) and math.isfinite(value):
                self.writer.add_scalar(name, float(value), round_number)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
