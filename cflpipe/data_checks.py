"""What `cflpipe validate` checks beyond the spec itself: each scenario's partition built in memory
from its data (nothing written, no training), so an impossible partition (more clients than
samples, more labels per client than classes, minimum sizes above the pool, `natural` without
devices, rotation of feature vectors, more swap groups than label permutations) and a dataset that
is not there are named before any job runs; and a `results_dir` that cannot hold results. Every
problem of every scenario is reported, not the first.

The workflows check only the spec before their jobs (a cluster's head node re-reads it for every
job, and the download rule may not have run yet); `validate` is where the data is looked at."""

from __future__ import annotations

import os
from pathlib import Path

from cflpipe.errors import CflpipeError
from cflpipe.spec import Spec


def data_problems(spec: Spec) -> tuple[list[str], list[str]]:
    """(errors, notes): one line per problem of the spec's scenarios and results_dir; notes name
    datasets whose partitions wait for a download."""
    from cflpipe.data.base import dataset_info, load_dataset
    from cflpipe.data.download import MARKER
    from cflpipe.partition import build_partition

    errors: list[str] = _results_dir_problems(spec)
    notes: list[str] = []
    loaded: dict[tuple, object | None] = {}
    for name, scenario in spec.scenarios.items():
        where = f"scenarios.{name}"
        dataset_name = scenario.dataset.name
        info = dataset_info(dataset_name, f"{where}.dataset")
        if info.downloadable and not (Path(spec.data_dir) / dataset_name / MARKER).exists():
            notes.append(f"{where}.dataset: {dataset_name} is not downloaded yet (the workflow's download rule "
                         f"fetches it; by hand: cflpipe download {dataset_name} --data-dir {spec.data_dir}); "
                         f"its partition is checked once it is there")
            continue
        key = (dataset_name, repr(sorted(scenario.dataset.params.items())))
        if key not in loaded:
            try:
                loaded[key] = load_dataset(dataset_name, scenario.dataset.params, spec.data_dir)
            except (CflpipeError, MemoryError) as exc:  # said once per dataset, at its first scenario
                loaded[key] = None
                errors.append(f"{where}.dataset: " + (str(exc) if isinstance(exc, CflpipeError)
                                                     else f"{dataset_name} does not fit in memory"))
        if loaded[key] is None:
            continue
        try:
            build_partition(scenario, loaded[key], where=where)  # type: ignore[arg-type]
        except CflpipeError as exc:
            errors.append(str(exc))
        except MemoryError:
            errors.append(f"{where}: the partition does not fit in memory")
    return errors, notes


def _results_dir_problems(spec: Spec) -> list[str]:
    folder = Path(spec.results_dir)
    if folder.exists() and not folder.is_dir():
        return [f"results_dir: {folder} is a file, not a folder"]
    existing = next((parent for parent in [folder, *folder.parents] if parent.exists()), None)
    if existing is not None and not existing.is_dir():
        return [f"results_dir: {folder} lies under {existing}, which is a file, not a folder"]
    if existing is not None and not os.access(existing, os.W_OK | os.X_OK):
        return [f"results_dir: {folder} cannot be created or written ({existing} is not writable)"]
    return []
