"""Every registered method end to end on a CUDA device, in one call of a lent GPU machine.

For each method, the conformance suite's tiny run (digits, 6 clients in 2 label-swap groups, mlp;
cflpipe.testing.spec_dict) for `--rounds` rounds:

- twice on the device with `trainer: auto` (batched on CUDA): are the outputs byte-identical
  (determinism on the GPU; cflpipe sets torch's deterministic algorithms on CUDA);
- once on the device with the sequential trainer, and once on the CPU: the final personalized
  accuracy and ARI beside the batched CUDA run's. Across devices and trainers the figures agree
  only to float rounding (different kernels and summation orders), never to the bit, so the
  differences are reported, not asserted.

Prints one line per method and a summary, writes every row as JSON (`--output`) and each
failure's traceback beside it. Run by hand (`python benchmarks/gpu_check.py --device cuda`); the
figures go to docs/performance.md. With `--device cpu` it checks itself on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import traceback
from pathlib import Path

import torch

from cflpipe.fl.engine import OUTPUT_FILES, train_run
from cflpipe.registry import all_methods
from cflpipe.spec import parse_spec
from cflpipe.testing import COMPARED, spec_dict


# With --config, a spec's scenario and seed replace the tiny run: (spec dict, scenario, seed).
SPEC: tuple[dict, str, int] | None = None


def _run(folder: Path, name: str, rounds: int, **training) -> tuple[Path, dict, float]:
    if SPEC is None:
        data, scenario, seed = spec_dict(folder, name, rounds=rounds, eval_every=rounds, checkpoint_every=rounds,
                                         **training), "s", 0
    else:
        data, scenario, seed = dict(SPEC[0]), SPEC[1], SPEC[2]
        data["training"] = {**data.get("training", {}), **training}
        data["results_dir"] = str(folder)
    spec = parse_spec(data)
    t0 = time.perf_counter()
    result = train_run(spec, scenario, name, seed, force=True, progress=False)
    return result.run_dir, result.summary["final"], time.perf_counter() - t0


def _differing_files(a: Path, b: Path) -> list[str]:
    own = {p.name for p in [*a.glob("*.parquet"), *b.glob("*.parquet")]} - set(OUTPUT_FILES)
    names = sorted(set(COMPARED) | own)
    return [f for f in names if not (a / f).exists() or not (b / f).exists()
            or (a / f).read_bytes() != (b / f).read_bytes()]


def check(name: str, workdir: Path, device: str, rounds: int, skip: tuple[str, ...] = (),
          compiled: bool = False) -> dict:
    extra = {"compile": True, "trainer": "batched"} if compiled else {}
    first, fig, seconds = _run(workdir / "first", name, rounds, device=device, **extra)
    again, _, _ = _run(workdir / "again", name, rounds, device=device, **extra)
    nan = {"acc_macro": float("nan"), "ari": float("nan"), "n_clusters": None}
    _, seq, seq_seconds = (_run(workdir / "sequential", name, rounds, device=device, trainer="sequential")
                           if "sequential" not in skip else (None, nan, float("nan")))
    _, cpu, cpu_seconds = (_run(workdir / "cpu", name, rounds, device="cpu") if "cpu" not in skip
                           else (None, nan, float("nan")))
    return {"method": name, "identical_rerun": not _differing_files(first, again),
            "differing_files": _differing_files(first, again),
            "acc": fig["acc_macro"], "acc_sequential": seq["acc_macro"], "acc_cpu": cpu["acc_macro"],
            "ari": fig["ari"], "ari_sequential": seq["ari"], "ari_cpu": cpu["ari"],
            "clusters": fig["n_clusters"], "clusters_sequential": seq["n_clusters"], "clusters_cpu": cpu["n_clusters"],
            "seconds": seconds, "seconds_sequential": seq_seconds, "seconds_cpu": cpu_seconds}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--method", action="append", default=None, help="default: every registered method")
    parser.add_argument("--output", default="gpu_check.json")
    parser.add_argument("--config", default=None, help="a spec whose --scenario and --seed replace the tiny run "
                                                       "(--method then names its method entries)")
    parser.add_argument("--scenario", default=None)
    parser.add_argument("--skip", action="append", choices=["sequential", "cpu"], default=[],
                        help="leave out the sequential-trainer or the CPU run")
    parser.add_argument("--compile", action="store_true",
                        help="the two device runs with training.compile (batched trainer, compiled step)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.config:
        import yaml

        global SPEC
        SPEC = (yaml.safe_load(Path(args.config).read_text()), args.scenario, args.seed)
    torch.set_num_threads(1)
    rows, failures = [], {}
    names = args.method or (sorted(SPEC[0]["methods"]) if SPEC else sorted(all_methods()))
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            try:
                row = check(name, Path(tmp) / name, args.device, args.rounds, tuple(args.skip), args.compile)
            except Exception as exc:  # one method's failure must not hide the others'
                failures[name] = traceback.format_exc()
                row = {"method": name, "error": f"{type(exc).__name__}: {exc}".splitlines()[0][:300]}
            rows.append(row)
            if "error" in row:
                print(f"{name:22s} FAILED {row['error']}", flush=True)
            else:
                print(f"{name:22s} rerun {'identical' if row['identical_rerun'] else 'DIFFERS ' + ','.join(row['differing_files'])}"
                      f"  acc {row['acc']:.4f} (sequential {row['acc_sequential']:.4f}, cpu {row['acc_cpu']:.4f})"
                      f"  ari {row['ari']:.3f}/{row['ari_sequential']:.3f}/{row['ari_cpu']:.3f}"
                      f"  clusters {row['clusters']}/{row['clusters_sequential']}/{row['clusters_cpu']}"
                      f"  {row['seconds']:.1f}s/{row['seconds_sequential']:.1f}s/{row['seconds_cpu']:.1f}s", flush=True)
            Path(args.output).write_text(json.dumps({"device": args.device, "rows": rows, "failures": failures,
                                                     "torch": torch.__version__,
                                                     "gpu": torch.cuda.get_device_name() if args.device == "cuda"
                                                     else None}, indent=1))
    ok = [r for r in rows if "error" not in r]
    gaps = {other: [abs(r["acc"] - r[f"acc_{other}"]) for r in ok if r[f"acc_{other}"] == r[f"acc_{other}"]]
            for other in ("cpu", "sequential")}
    print(f"{len(ok)} of {len(rows)} methods ran on {args.device}; "
          f"{sum(r['identical_rerun'] for r in ok)} reran byte-identical"
          + "".join(f"; largest |acc - acc_{other}| {max(values):.4f}" for other, values in gaps.items() if values))
    return 0 if len(ok) == len(rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
