"""Command line: argument parsing, progress, exit codes and one-line errors. The work itself is
done by the modules each subcommand calls."""

from __future__ import annotations

import argparse
import os
import sys

from cflpipe.errors import CflpipeError, SpecError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line and exit 2, like every other bad input
        raise SpecError(f"{self.prog}: {message}")


def _add_config(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, metavar="FILE", help="experiment spec (YAML)")


def _scenario(spec, name: str) -> str:
    if name not in spec.scenarios:
        raise SpecError(f"--scenario: unknown scenario {name!r}; allowed: {', '.join(spec.scenarios)}")
    return name


def _method(spec, name: str) -> str:
    if name not in spec.methods:
        raise SpecError(f"--method: unknown method {name!r}; allowed: {', '.join(spec.methods)}")
    return name


def _seed(spec, seed: int) -> int:
    if seed not in spec.seeds:
        allowed = ", ".join(str(s) for s in spec.seeds)
        raise SpecError(f"--seed: {seed} is not one of the spec's seeds; allowed: {allowed}")
    return seed


def cmd_validate(args) -> int:
    from cflpipe.spec import load_spec

    spec = load_spec(args.config)
    runs = len(spec.matrix())
    print(f"{args.config}: ok ({runs} runs: {len(spec.scenarios)} scenarios, {len(spec.methods)} methods, "
          f"{len(spec.seeds)} seeds)")
    return 0


def cmd_download(args) -> int:
    from cflpipe.data.download import describe_resources, download_dataset
    from cflpipe.data.base import dataset_info

    info = dataset_info(args.name, "NAME")
    if info.manual is not None:
        from pathlib import Path

        from cflpipe.errors import DataError

        raise DataError(info.manual(args.name, Path(args.data_dir) / args.name))
    if not info.downloadable:
        print(f"{args.name}: " + ("your own files (dataset: {name: files, path: FILE}), nothing to download"
                                  if info.inputs is not None else "embedded dataset, nothing to download"))
        return 0
    if args.list:
        for line in describe_resources(args.name, args.data_dir):
            print(line)
        return 0
    path = download_dataset(args.name, args.data_dir, progress=not args.quiet, base_url=args.mirror)
    print(f"{args.name}: ready in {path}")
    return 0


def cmd_partition(args) -> int:
    from cflpipe.fl.data import partition_scenario
    from cflpipe.spec import load_spec

    spec = load_spec(args.config, check_methods=False)
    out = partition_scenario(spec, _scenario(spec, args.scenario), force=True)
    print(f"partition of {args.scenario} written to {out}")
    return 0


def cmd_train(args) -> int:
    from cflpipe.fl.engine import train_run
    from cflpipe.spec import load_spec

    cpus = os.cpu_count() or 1
    if not 1 <= args.threads <= cpus:
        raise SpecError(f"--threads: must lie in [1, {cpus}] (the CPUs of this machine), got {args.threads}")
    import torch

    torch.set_num_threads(args.threads)
    spec = load_spec(args.config)
    scenario, method = _scenario(spec, args.scenario), _method(spec, args.method)
    seeds = [_seed(spec, seed) for seed in args.seed]
    twice = sorted({seed for seed in seeds if seeds.count(seed) > 1})
    if twice:
        raise SpecError(f"--seed: {' '.join(map(str, twice))} given twice; give each seed once")
    # Several seeds in one process pay Python's and torch's start-up once (most of a small run's
    # time); every run is still its own folder, resumed or skipped on its own. A failed run does
    # not keep the job's other seeds from training; the first failure is the job's error.
    failed: list[tuple[int, CflpipeError]] = []
    for seed in seeds:
        try:
            result = train_run(spec, scenario, method, seed, force=args.force, progress=not args.quiet)
        except CflpipeError as exc:
            failed.append((seed, exc))
            continue
        print(result.message, flush=True)
    if failed:
        seed, first = failed[0]
        others = [str(k) for k, _ in failed[1:]]
        also = f" (seeds {', '.join(others)} failed too)" if others else ""
        raise type(first)(f"{first}{also}")  # the first failure's class: its exit code
    return 0


def cmd_methods(args) -> int:
    from cflpipe.methods import all_methods

    for name, info in all_methods().items():
        print(f"{name}: {info.description}")
        if info.capabilities.summary():
            print(f"    [{info.capabilities.summary()}]")
        for field, f in info.params.model_fields.items():
            doc = f" — {f.description}" if f.description else ""
            print(f"    {field} = {f.default!r}{doc}")
    return 0


def cmd_clean(args) -> int:
    from cflpipe.fl.engine import clean_runs

    from cflpipe.spec import load_spec

    spec = load_spec(args.config, check_methods=False)
    verb = "would free" if args.dry_run else "freed"
    cleaned = clean_runs(spec, dry_run=args.dry_run)
    for run in cleaned:
        if run.freed is None:
            print(f"{run.run_dir}: another process is writing this run; left alone")
        else:
            print(f"{run.run_dir}/state: {verb} {_size(run.freed)}")
    freed = [run.freed for run in cleaned if run.freed is not None]
    print(f"{args.config}: {verb} {_size(sum(freed))} in {len(freed)} finished runs of "
          f"{len(spec.matrix())} ({spec.results_dir}/runs)")
    return 0


def _size(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} B"  # unreachable: GB returns above


def cmd_aggregate(args) -> int:
    from cflpipe.report.aggregate import aggregate
    from cflpipe.spec import load_spec

    out = aggregate(load_spec(args.config))
    print(f"aggregate written to {out}")
    return 0


def cmd_report(args) -> int:
    from cflpipe.report.build import build_report
    from cflpipe.spec import load_spec

    out = build_report(load_spec(args.config))
    print(f"report written to {out}")
    return 0


def cmd_dvc_runs(args) -> int:
    from cflpipe.dvcgen import run

    return run(args)


def cmd_bench(args) -> int:
    from cflpipe.bench import run_bench

    if args.threads is not None:
        import torch

        torch.set_num_threads(max(1, args.threads))
    run_bench(workloads=args.workload, rounds=args.rounds, output=args.output, repeats=args.repeats,
              parts=args.part)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="cflpipe", description=__doc__)
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("validate", help="check a spec; one line per problem")
    _add_config(p)
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("download", help="fetch and verify a dataset into resources/datasets/NAME")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--data-dir", default="resources/datasets")
    p.add_argument("--mirror", default=None, metavar="URL",
                   help="base URL that replaces the official hosts (also CFLPIPE_DATASET_MIRROR)")
    p.add_argument("--list", action="store_true", help="print the files, URLs and checksums")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_download)

    p = sub.add_parser("partition", help="write results/partitions/SCENARIO/")
    _add_config(p)
    p.add_argument("--scenario", required=True)
    p.set_defaults(func=cmd_partition)

    p = sub.add_parser("train", help="run one scenario × method for one or more seeds")
    _add_config(p)
    p.add_argument("--scenario", required=True)
    p.add_argument("--method", required=True)
    p.add_argument("--seed", required=True, type=int, nargs="+", metavar="SEED",
                   help="one or more of the spec's seeds, run one after the other in this process "
                        "(the workflow passes all of them: start-up is paid once)")
    p.add_argument("--force", action="store_true", help="re-run a finished run from scratch")
    p.add_argument("--threads", type=int, default=1,
                   help="CPU threads for torch (default 1, as the workflow's jobs: the bytes of a run depend on "
                        "it, and it is recorded in the run's config.yaml)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("aggregate", help="mean ± std over seeds of every finished run")
    _add_config(p)
    p.set_defaults(func=cmd_aggregate)

    p = sub.add_parser("report", help="results/report/index.html and paper-style tables")
    _add_config(p)
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("methods", help="list methods with their hyper-parameters and defaults")
    p.set_defaults(func=cmd_methods)

    p = sub.add_parser("clean", help="cut down the checkpoints of the spec's finished runs (models dropped)")
    _add_config(p)
    p.add_argument("--dry-run", action="store_true", help="say what would be freed; change nothing")
    p.set_defaults(func=cmd_clean)

    p = sub.add_parser("dvc-runs", help="write workflow/dvc-runs.yaml, the run list dvc.yaml loops over")
    from cflpipe.dvcgen import add_arguments

    add_arguments(p)
    p.set_defaults(func=cmd_dvc_runs)

    p = sub.add_parser("bench", help="engine overhead and per-round time on standard workloads")
    p.add_argument("--workload", action="append", choices=["digits", "synthetic"], default=None)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--repeats", type=int, default=3, help="alternating repeats; the fastest counts")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch")
    p.add_argument("--output", default=None, metavar="FILE", help="also write the figures as JSON")
    p.add_argument("--part", action="append", choices=["overhead", "trainers", "eval"], default=None,
                   help="what to measure (repeatable; default all): engine overhead, batched vs sequential "
                        "trainer, evaluation chunking")
    p.set_defaults(func=cmd_bench)
    return parser


def _version() -> str:
    from cflpipe import __version__

    return f"cflpipe {__version__}"


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except CflpipeError as exc:
        for line in str(exc).splitlines():
            print(f"error: {line}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug or an environment failure (e.g. out of memory): one line
        if os.environ.get("CFLPIPE_DEBUG"):
            raise
        first = (str(exc).strip().splitlines() or [""])[0]
        print(f"error: {type(exc).__name__}: {first} (set CFLPIPE_DEBUG=1 for the traceback)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
