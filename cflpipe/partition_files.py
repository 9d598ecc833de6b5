"""A scenario's partition folder (results/partitions/<scenario>/): written from the dataset,
fingerprinted by the scenario it was built from, its tables' digests kept beside them, so a
partition left over from an edited scenario or a table copied in from another is never trained
on. No torch: `cflpipe partition` jobs need none (it cost them about 2.3 s of CPU each)."""

from __future__ import annotations

import json
from pathlib import Path

from cflpipe.data import load_dataset
from cflpipe.partition import DRIFT_FILE, PUBLIC_FILE, build_partition, write_partition
from cflpipe.spec import Spec
from cflpipe.store import sha256_of, write_text

PARTITION_FILES = ("clients.parquet", "stats.parquet", "label_hist.png")
# What the partition was built from, so a partition left over from an edited scenario is not
# silently trained on.
FINGERPRINT = "scenario.json"
# sha256 of the partition's tables, so that a table copied in from another scenario is noticed.
DIGESTS = "partition.sha256"


def input_digests(spec: Spec, scenario: str) -> dict[str, str | None]:
    """sha256 of the files a scenario's dataset is read from, for datasets that ask for it (a
    user's own file): part of the partition's fingerprint and of each run's config, so an edited
    file is neither partitioned nor trained on as if it were the old one. Empty for the others."""
    from cflpipe.data.base import dataset_info

    dataset = spec.scenarios[scenario].dataset
    info = dataset_info(dataset.name)
    if not info.hash_inputs:
        return {}
    paths = info.inputs(info.params(**dataset.params), Path(spec.data_dir))
    return {str(p): sha256_of(p) if p.is_file() else None for p in paths}


def _fingerprint(spec: Spec, scenario: str) -> str:
    definition = spec.scenarios[scenario].definition()
    digests = input_digests(spec, scenario)
    if digests:
        definition["inputs_sha256"] = digests
    return json.dumps(definition, sort_keys=True, indent=2) + "\n"


def partition_scenario(spec: Spec, scenario: str, force: bool = False) -> Path:
    """Write results/partitions/<scenario>/ (skipped when already there and built from the same
    scenario, unless forced)."""
    out = spec.partition_dir(scenario)
    fingerprint = _fingerprint(spec, scenario)
    current = out / FINGERPRINT
    if not force and all((out / name).exists() for name in PARTITION_FILES) \
            and current.exists() and current.read_text() == fingerprint and _digest_problem(out) is None:
        return out
    sc = spec.scenarios[scenario]
    dataset = load_dataset(sc.dataset.name, sc.dataset.params, spec.data_dir)
    (out / DIGESTS).unlink(missing_ok=True)
    write_partition(build_partition(sc, dataset, where=f"scenarios.{scenario}"), out)
    names = [name for name in (*PARTITION_FILES[:2], PUBLIC_FILE, DRIFT_FILE) if (out / name).exists()]
    write_text(out / DIGESTS, "".join(f"{sha256_of(out / name)}  {name}\n" for name in names))
    write_text(current, fingerprint)
    return out


def _digest_problem(out: Path) -> str | None:
    """Why the partition's tables do not match the digests written with them (None: they do;
    partitions written before digests existed have none and are taken as they are)."""
    digests = out / DIGESTS
    if not digests.exists():
        return None
    for line in digests.read_text().splitlines():
        expected, _, name = line.partition("  ")
        if not (out / name).is_file():
            return f"{out / name}: missing"
        if sha256_of(out / name) != expected:
            return f"{out / name}: does not match {DIGESTS} (replaced or altered after it was written)"
    return None
