"""A run's curves while it trains (`workflow: {live: true}`), written with DVCLive.

At every evaluation the run appends its headline figures to `RUN/live/plots/metrics/<figure>.tsv`
(step = round) and rewrites `RUN/live/metrics.json`: what `dvc plots show RUN/live/plots/metrics`,
DVC's VS Code extension and Studio draw as the run goes. Off by default: importing DVCLive costs
about a second per process. The folder is a view, not an output: nothing reads it back, it changes
no other file of the run, and a resumed run first drops the rows its checkpoint does not hold.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

LIVE_DIR = "live"
# rounds.parquet's figures a researcher watches: accuracy, the clustering, the training loss.
LIVE_FIGURES = ("acc_macro", "acc_micro", "ari", "n_clusters", "train_loss")


class LiveCurves:
    def __init__(self, run_dir: Path, start_round: int):
        from dvclive import Live

        folder = run_dir / LIVE_DIR
        if start_round == 0:
            shutil.rmtree(folder, ignore_errors=True)
        else:
            _drop_rows_after(folder / "plots" / "metrics", start_round)
        # No dvc.yaml, no experiment, no system monitor: the workflow owns those.
        self.live = Live(dir=str(folder), resume=start_round > 0, save_dvc_exp=False, dvcyaml=None,
                         monitor_system=False)

    def log(self, round_number: int, row: dict) -> None:
        self.live.step = round_number
        for name in LIVE_FIGURES:
            value = row.get(name)
            if isinstance(value, (int, float)) and math.isfinite(value):
                self.live.log_metric(name, float(value))
        self.live.make_summary()

    def close(self) -> None:
        self.live.end()


def _drop_rows_after(folder: Path, last_round: int) -> None:
    """A run killed after an evaluation and before its next checkpoint re-trains those rounds:
    their rows go, so the curve does not draw them twice."""
    for path in folder.glob("*.tsv") if folder.is_dir() else ():
        header, *rows = path.read_text().splitlines()
        kept = [row for row in rows if int(row.split("\t", 1)[0]) <= last_round]
        path.write_text("\n".join([header, *kept]) + "\n")
