"""`cflpipe dvc-runs`: the run list dvc.yaml loops over."""

from __future__ import annotations

import argparse

from cflpipe.commands import Command


def cmd_dvc_runs(args) -> int:
    from cflpipe.dvcgen import run

    return run(args)


def _dvc_runs_arguments(p: argparse.ArgumentParser) -> None:
    from cflpipe.dvcgen import add_arguments

    add_arguments(p)


DVC_RUNS = Command(
    "dvc-runs", "write workflow/dvc-runs.yaml, the run list dvc.yaml loops over",
    "DVC cannot compute a run list, so dvc.yaml's foreach loops read this generated file. Run it\n"
    "again after adding or removing scenarios, methods, seeds or datasets, or changing\n"
    "results_dir/data_dir; stage aggregate checks it.",
    "  cflpipe dvc-runs && dvc repro\n",
    _dvc_runs_arguments, cmd_dvc_runs)
