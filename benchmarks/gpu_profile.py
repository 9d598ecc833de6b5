"""Where a yardstick round's time goes (cflpipe bench --part yardstick, batched trainer).

Host side: cProfile over a whole run, the top functions by own and by cumulative time. Device
side (`--kernels`): torch.profiler over a short run per precision, operators by self CUDA time
and the number of kernel launches, to see what bf16 autocast adds. Run by hand on a GPU
machine (`python benchmarks/gpu_profile.py --device cuda --output-dir DIR`); findings go to
docs/performance.md.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
from pathlib import Path

import torch

from cflpipe.bench import bench_yardstick


def host_profile(device: str, rounds: int, out: Path) -> None:
    profiler = cProfile.Profile()
    profiler.enable()
    bench_yardstick(rounds=rounds, device=device, trainers=("batched",))
    profiler.disable()
    for order in ("tottime", "cumulative"):
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats(order).print_stats(45)
        (out / f"host_{order}.txt").write_text(text.getvalue())


def kernel_profile(device: str, rounds: int, precision: str, out: Path) -> None:
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        bench_yardstick(rounds=rounds, device=device, trainers=("batched",), precisions=(precision,))
    key = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
    events = prof.key_averages()
    launches = sum(e.count for e in events if e.key.startswith(("cudaLaunchKernel", "cuLaunchKernel")))
    table = events.table(sort_by=key, row_limit=30)
    (out / f"kernels_{precision}.txt").write_text(f"kernel launches: {launches}\n{table}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--kernels", action="append", default=[], choices=["float32", "tf32", "bf16"])
    parser.add_argument("--kernel-rounds", type=int, default=8)
    parser.add_argument("--output-dir", default=".")
    args = parser.parse_args()
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    if args.rounds:
        host_profile(args.device, args.rounds, out)
    for precision in args.kernels:
        kernel_profile(args.device, args.kernel_rounds, precision, out)


if __name__ == "__main__":
    main()
