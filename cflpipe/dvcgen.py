"""`dvc-runs.yaml`: the lists dvc.yaml iterates over, derived from a spec (`cflpipe dvc-runs`).

DVC cannot compute a run list: `matrix:` has no exclusions (a method may run on some scenarios
only), so dvc.yaml's `foreach:` loops read this generated file instead. It holds only names and
paths; every value a stage depends on is tracked as a DVC param in the spec file itself, so
`dvc exp run -S config/config.yaml:training.rounds=10` works. Re-generate after adding or
removing scenarios, methods, seeds or datasets, or changing results_dir/data_dir or
workflow.train_jobs; the aggregate
stage runs `--check` first and stops with that reminder when the file is out of date.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from cflpipe.errors import CflpipeError, SpecError

DEFAULT_OUTPUT = "workflow/dvc-runs.yaml"
# Partitions of embedded datasets depend on the code that generates the data (DVC needs a file).
EMBEDDED_SOURCE = "cflpipe/data/embedded.py"
# Spec keys dvc.yaml lists as params; DVC refuses a param that is not written in the file.
REQUIRED_KEYS = ("seeds", "training")


def job_name(scenario: str, method: str | None = None) -> str:
    """Stage suffix of one training job: `train@<scenario>` (every method × seed of it) or
    `train@<scenario>.<method>` (every seed of one method; names never contain dots)."""
    return scenario if method is None else f"{scenario}.{method}"


def dvc_runs(config: str | Path) -> dict:
    """The data of dvc-runs.yaml for the spec at `config` (a path relative to the repository)."""
    from cflpipe.data.base import dataset_info
    from cflpipe.spec import load_spec, read_yaml

    config = _repo_path(config)
    spec = load_spec(config)
    raw = read_yaml(config)
    if spec.tuning is not None:
        raise SpecError(f"{config}: tuning: the DVC pipeline has no tuning stages; run this spec with snakemake "
                        f"(its tune and tune_select jobs), or `cflpipe tune` and `cflpipe tune-select` by hand")
    missing = [key for key in REQUIRED_KEYS if key not in raw]
    if missing:
        raise SpecError(f"{config}: dvc.yaml tracks {' and '.join(f'`{k}`' for k in missing)} as DVC "
                        "params; write them in the spec (the defaults are `seeds: [0]` and `training: {}`)")
    downloads = sorted({sc.dataset.name for sc in spec.scenarios.values()
                        if dataset_info(sc.dataset.name).downloadable})
    partitions = {}
    for name, sc in spec.scenarios.items():
        dataset = sc.dataset.name
        info = dataset_info(dataset)
        if dataset in downloads or info.manual is not None:  # the dataset's folder
            source = f"{spec.data_dir}/{dataset}"
        elif info.inputs is not None:  # a user's own file
            source = str(info.inputs(info.params(**sc.dataset.params), Path(spec.data_dir))[0])
        else:
            source = EMBEDDED_SOURCE
        partitions[name] = {"data": source}
    # One stage trains several runs in one process, as a Snakemake job does: every method × seed
    # of a scenario, or with `workflow.train_jobs: method` every seed of a scenario × method.
    # `runs` is the folder the stage keeps (persist), `param` the spec key its runs depend on
    # besides training and the scenario: the method's key in the spec file (a sweep's entry for
    # the entries it expands into; DVC tracks params only under keys written in the file), or all
    # of `methods` for a scenario's stage.
    seeds = " ".join(str(seed) for seed in spec.seeds)
    pairs = list(dict.fromkeys((s, m) for s, m, _ in spec.matrix()))
    if spec.workflow.train_jobs == "method":
        jobs = {job_name(s, m): {"scenario": s, "methods": m, "runs": f"{s}/{m}",
                                 "param": f"methods.{spec.method_entry(m)}", "seeds": seeds} for s, m in pairs}
    else:
        jobs = {job_name(s): {"scenario": s, "methods": " ".join(m for t, m in pairs if t == s), "runs": s,
                              "param": "methods", "seeds": seeds} for s in dict.fromkeys(s for s, _ in pairs)}
    from cflpipe.report.aggregate import plotted_methods

    return {"config": config, "results": spec.results_dir, "data": spec.data_dir,
            "downloads": downloads, "partitions": partitions, "jobs": jobs, "plot_methods": plotted_methods(spec)}


def render(config: str | Path) -> str:
    data = dvc_runs(config)
    config = data["config"]

    def flow(value) -> str:  # one line of YAML; a scalar without the document end marker
        text = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=10**6).strip()
        return text.removesuffix("\n...").strip()

    lines = [
        f"# Written by `cflpipe dvc-runs --config {config}`; do not edit. dvc.yaml's foreach loops",
        "# iterate over these names: re-run that command after adding or removing scenarios, methods,",
        "# seeds or datasets, or changing results_dir, data_dir or workflow.train_jobs (stage aggregate",
        "# checks it).",
        f"config: {flow(config)}",
        f"results: {flow(data['results'])}",
        f"data: {flow(data['data'])}",
        f"downloads: {flow(data['downloads'])}",
        "partitions:" + ("" if data["partitions"] else " {}"),
        *(f"  {flow(name)}: {flow(item)}" for name, item in data["partitions"].items()),
        "jobs:" + ("" if data["jobs"] else " {}"),
        *(f"  {flow(name)}: {flow(item)}" for name, item in data["jobs"].items()),
        # dvc.yaml's plot: the columns of aggregate/plots/<scenario>.csv, a plot per scenario
        f"plot_methods: {flow(data['plot_methods'])}",
    ]
    return "\n".join(lines) + "\n"


def write(config: str | Path, output: str | Path = DEFAULT_OUTPUT) -> Path:
    from cflpipe.store import write_text

    output = Path(output)
    write_text(output, render(config))
    return output


def check(config: str | Path, output: str | Path = DEFAULT_OUTPUT) -> None:
    """Raise SpecError when `output` is missing or differs from what `config` gives."""
    output = Path(output)
    expected = render(config)
    config = _repo_path(config)
    if not output.is_file() or output.read_text() != expected:
        state = "is out of date" if output.is_file() else "does not exist"
        raise SpecError(f"{output}: {state} for {config} (its scenarios, methods, seeds, paths or "
                       f"workflow.train_jobs changed); "
                        f"run `cflpipe dvc-runs --config {config}`, then `dvc repro` again")


def _repo_path(config: str | Path) -> str:
    """The spec path as DVC needs it: relative to the repository root (the working directory)."""
    path = Path(config)
    if not path.is_file():
        raise SpecError(f"--config: file {str(path)!r} does not exist")
    try:
        return path.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        raise SpecError(f"--config: DVC needs a spec inside the repository (run from its root), "
                        f"got {str(config)!r}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default="config/config.yaml", metavar="FILE",
                        help="experiment spec (YAML; default: config/config.yaml)")
    parser.add_argument("--output", default=DEFAULT_OUTPUT, metavar="FILE",
                        help=f"where to write the lists (default: {DEFAULT_OUTPUT})")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; fail when FILE is missing or out of date")


def run(args: argparse.Namespace) -> int:
    if args.check:
        check(args.config, args.output)
        print(f"{args.output}: up to date with {args.config}")
    else:
        data = dvc_runs(args.config)
        write(args.config, args.output)
        counts = ", ".join(f"{len(data[key])} {noun}{'' if len(data[key]) == 1 else 's'}" for key, noun in (
            ("jobs", "training job"), ("partitions", "partition"), ("downloads", "download")))
        print(f"{args.output}: {counts} from {data['config']}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m cflpipe.dvcgen`, the same as `cflpipe dvc-runs`."""
    parser = argparse.ArgumentParser(prog="cflpipe dvc-runs", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except CflpipeError as exc:
        for line in str(exc).splitlines():
            print(f"error: {line}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
