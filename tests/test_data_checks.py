"""`cflpipe validate` looks at the data: impossible partitions and missing data are named before
any job runs, every problem of a spec at once (#33 item 3)."""

import subprocess
import sys

import pytest
import yaml

from cflpipe.data_checks import data_problems
from cflpipe.spec import parse_spec


def spec(tmp_path, **scenario) -> dict:
    return {"seeds": [0], "training": {"model": "mlp", "rounds": 2, "clients_per_round": 2},
            "scenarios": {"s": {"dataset": "digits", "clients": 4, "partition": [{"kind": "iid"}], **scenario}},
            "methods": {"fedavg": {}}, "results_dir": str(tmp_path / "results"), "data_dir": str(tmp_path / "data")}


@pytest.mark.parametrize("scenario, line", [
    ({"clients": 5000}, "scenarios.s.clients: 5000 clients need at least 1 sample each, pool has 1797"),
    ({"partition": [{"kind": "pathological", "labels_per_client": 11}]},
     "scenarios.s.partition[0].labels_per_client: must be <= the 10 classes of dataset digits, got 11"),
    ({"partition": [{"kind": "dirichlet", "alpha": 0.5, "min_size": 2000}]},
     "scenarios.s.partition[0].min_size: 4 clients × 2000 samples needs 8000, pool has 1797"),
    ({"partition": [{"kind": "iid"}, {"kind": "quantity", "min": 1000, "max": 2000}]},
     "scenarios.s.partition[1].min: 4 clients × 1000 samples needs 4000, pool has 1797"),
    ({"partition": [{"kind": "natural"}]},
     "scenarios.s.partition[0].kind: dataset digits has no natural split (no generating device per sample); "
     "use iid, dirichlet or pathological"),
    ({"dataset": "mnist1d", "partition": [{"kind": "iid"}, {"kind": "rotation", "groups": 2}]},
     "scenarios.s.partition[1].kind: rotation needs an image dataset; dataset mnist1d has inputs of shape (40,); on feature vectors, groups by label_swap (a concept shift) work"),
])
def test_an_impossible_partition_is_named_by_validate(tmp_path, scenario, line):
    assert data_problems(parse_spec(spec(tmp_path, **scenario))) == ([line], [])


def test_every_scenario_s_problem_is_reported_in_one_pass(tmp_path):
    data = spec(tmp_path, partition=[{"kind": "pathological", "labels_per_client": 11}])
    data["scenarios"]["t"] = {"dataset": "digits", "clients": 5000, "partition": [{"kind": "iid"}]}
    errors, _ = data_problems(parse_spec(data))
    assert [line.split(":")[0] for line in errors] == ["scenarios.s.partition[0].labels_per_client",
                                                       "scenarios.t.clients"]


def test_a_results_dir_under_a_file_is_refused(tmp_path):
    (tmp_path / "afile").write_text("x")
    data = {**spec(tmp_path), "results_dir": str(tmp_path / "afile" / "results")}
    assert data_problems(parse_spec(data))[0] == [
        f"results_dir: {tmp_path / 'afile' / 'results'} lies under {tmp_path / 'afile'}, which is a file, not a folder"]


def test_validate_notes_data_not_downloaded_yet_and_exits_non_zero_on_an_error(tmp_path):
    config = tmp_path / "spec.yaml"
    config.write_text(yaml.safe_dump(spec(tmp_path, dataset="mnist")))
    proc = subprocess.run([sys.executable, "-m", "cflpipe", "validate", "--config", str(config)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{config}: ok (1 run: 1 scenario, 1 method, 1 seed; results in {tmp_path / 'results'}/)\n"
    assert proc.stderr == (f"warning: scenarios.s.dataset: mnist is not downloaded yet (the workflow's download rule "
                           f"fetches it; by hand: cflpipe download mnist --data-dir {tmp_path / 'data'}); "
                           f"its partition is checked once it is there\n")
    config.write_text(yaml.safe_dump(spec(tmp_path, clients=5000)))
    proc = subprocess.run([sys.executable, "-m", "cflpipe", "validate", "--config", str(config)],
                          capture_output=True, text=True)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == "error: scenarios.s.clients: 5000 clients need at least 1 sample each, pool has 1797\n"


def test_a_synthetic_dataset_too_large_to_generate_is_refused_by_the_spec(tmp_path):
    from cflpipe.errors import SpecError

    with pytest.raises(SpecError) as info:
        parse_spec(spec(tmp_path, dataset={"name": "synthetic", "dimension": 10**12}))
    assert str(info.value) == ("scenarios.s.dataset: 27077 samples of 1000000000000 features and 10 classes need "
                               "2.71e+16 values (2.02e+08 GiB to generate), at most 1e+09; lower dimension, classes, "
                               "devices or max_samples")
    with pytest.raises(SpecError) as info:
        parse_spec(spec(tmp_path, dataset={"name": "synthetic", "classes": 10**6}))
    assert "and 1000000 classes need" in str(info.value)


def test_hand_placed_files_are_checked_not_noted_as_missing(tmp_path):
    """Files placed by hand (`cflpipe download NAME --list`) carry no download marker: validate
    reads them like training does, so a bad partition of them is an error, not a note."""
    import gzip
    import struct

    import numpy as np

    folder = tmp_path / "data" / "mnist"
    folder.mkdir(parents=True)
    for split, n in (("train", 30), ("t10k", 12)):
        images = np.zeros((n, 28, 28), np.uint8)
        with gzip.open(folder / f"{split}-images-idx3-ubyte.gz", "wb") as f:
            f.write(struct.pack(">IIII", 2051, n, 28, 28) + images.tobytes())
        with gzip.open(folder / f"{split}-labels-idx1-ubyte.gz", "wb") as f:
            f.write(struct.pack(">II", 2049, n) + (np.arange(n) % 10).astype(np.uint8).tobytes())
    assert data_problems(parse_spec(spec(tmp_path, dataset="mnist", clients=100))) == (
        ["scenarios.s.clients: 100 clients need at least 1 sample each, pool has 42"], [])
