"""What `cflpipe validate` checks beyond the spec itself: each scenario's partition built in memory
from its data (no partition or run written, no training; a dataset's parsed-array cache may be,
as the first job would write it), so an impossible partition (more clients than
samples, more labels per client than classes, minimum sizes above the pool, `natural` without
devices, rotation of feature vectors, more swap groups than label permutations) and a dataset that
is not there are named before any job runs; and a `results_dir` that cannot hold results. Every
problem of every scenario is reported, not the first.

The workflows check only the spec before their jobs (a cluster's head node re-reads it for every
job, and the download rule may not have run yet); `validate` is where the data is looked at."""

from __future__ import annotations

import os
from pathlib import Path

from cflpipe.errors import CflpipeError, DataError
from cflpipe.spec import Spec


def data_problems(spec: Spec) -> tuple[list[str], list[str]]:
    """(errors, notes): one line per problem of the spec's scenarios and results_dir; notes name
    datasets whose partitions wait for a download."""
    from cflpipe.data.base import dataset_info, load_dataset
    from cflpipe.partition import build_partition

    errors: list[str] = _results_dir_problems(spec)
    notes: list[str] = []
    keys = {name: (sc.dataset.name, repr(sorted(sc.dataset.params.items()))) for name, sc in spec.scenarios.items()}
    last_use = {key: name for name, key in keys.items()}  # a dataset is let go after its last scenario
    loaded: dict[tuple, object | None] = {}
    for name, scenario in spec.scenarios.items():
        where, key = f"scenarios.{name}", keys[name]
        dataset_name = scenario.dataset.name
        if key not in loaded:
            try:
                loaded[key] = load_dataset(dataset_name, scenario.dataset.params, spec.data_dir)
            except DataError as exc:
                loaded[key] = None
                if dataset_info(dataset_name).downloadable and str(exc).startswith(f"dataset {dataset_name} is not in"):
                    notes.append(f"{where}.dataset: {dataset_name} is not downloaded yet (the workflow's download "
                                 f"rule fetches it; by hand: cflpipe download {dataset_name} --data-dir "
                                 f"{spec.data_dir}); its partition is checked once it is there")
                else:  # said once per dataset, at its first scenario
                    errors.append(f"{where}.dataset: {exc}")
            except CflpipeError as exc:
                loaded[key] = None
                errors.append(f"{where}.dataset: {exc}")
            except MemoryError:
                loaded[key] = None
                errors.append(f"{where}.dataset: {dataset_name} does not fit in memory")
            except Exception as exc:  # a loader's own failure: named, and the other scenarios still checked
                loaded[key] = None
                errors.append(f"{where}.dataset: {dataset_name} could not be loaded ({type(exc).__name__}: "
                              f"{' '.join(str(exc).split())[:120]})")
        if loaded[key] is not None:
            try:
                build_partition(scenario, loaded[key], where=where)  # type: ignore[arg-type]
            except CflpipeError as exc:
                errors.append(str(exc))
            except MemoryError:
                errors.append(f"{where}: the partition does not fit in memory")
        if last_use[key] == name:
            loaded[key] = None
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
