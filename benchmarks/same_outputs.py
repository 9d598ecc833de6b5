"""Are two trees of runs byte-identical? The check behind a refactor that claims to change no result.

    # every registered method's conformance tiny run (cflpipe.testing.spec_dict), ROUNDS rounds, into OUT
    python benchmarks/same_outputs.py train OUT [--rounds 8] [--method NAME ...]
    # compare two run trees: every run folder below NEW against the same path below OLD
    python benchmarks/same_outputs.py compare OLD NEW

Train once with the code before the change (e.g. a `git worktree` of it on PYTHONPATH) and once
after, then compare; or compare the `results/runs` of two `snakemake` runs of one spec. Every
file of a run is compared to the byte except the timing files, the lock, and config.yaml's
data_dir line (the trees live in different folders); of summary.json the `final` figures. Prints
the counts and each differing file, and exits 1 when one differs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SKIPPED = {"timing.json", "timing.parquet", "summary.json", ".lock"}


def train(out: Path, rounds: int, only: list[str]) -> None:
    from cflpipe.fl.engine import train_run
    from cflpipe.registry import all_methods
    from cflpipe.spec import parse_spec
    from cflpipe.testing import spec_dict

    for name in all_methods():
        if ":" in name or (only and name not in only):
            continue
        spec = spec_dict(out / name, name)
        spec["training"]["rounds"] = rounds
        train_run(parse_spec(spec), "s", name, 0, progress=False)
        print(name, flush=True)


def _config(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if not line.startswith("data_dir:")]


def compare(old: Path, new: Path) -> int:
    same, differing, runs = 0, [], 0
    for run in sorted(p.parent for p in new.rglob("summary.json")):
        before = old / run.relative_to(new)
        runs += 1
        if not before.is_dir():
            differing.append(f"{run.relative_to(new)}: no such run below {old}")
            continue
        for path in sorted(p for p in run.iterdir() if p.is_file() and p.name not in SKIPPED):
            other = before / path.name
            if path.name == "config.yaml":
                equal = other.exists() and _config(path) == _config(other)
            else:
                equal = other.exists() and path.read_bytes() == other.read_bytes()
            if equal:
                same += 1
            else:
                differing.append(str(path.relative_to(new)))
        finals = [json.loads((folder / "summary.json").read_text()).get("final") for folder in (run, before)]
        if finals[0] != finals[1]:
            differing.append(f"{run.relative_to(new)}/summary.json: final figures")
    print(f"{runs} runs, {same} files identical, {len(differing)} differing")
    for line in differing:
        print("  " + line)
    return 1 if differing else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    trained = commands.add_parser("train")
    trained.add_argument("out", type=Path)
    trained.add_argument("--rounds", type=int, default=8)
    trained.add_argument("--method", action="append", default=[])
    compared = commands.add_parser("compare")
    compared.add_argument("old", type=Path)
    compared.add_argument("new", type=Path)
    args = parser.parse_args()
    if args.command == "train":
        train(args.out, args.rounds, args.method)
        return 0
    return compare(args.old, args.new)


if __name__ == "__main__":
    sys.exit(main())
