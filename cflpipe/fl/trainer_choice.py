"""Which trainer a run gets: `training.trainer` (auto picks sequential or batched by device and
model), an installed plugin's or a `module:Class` reference. Above the trainers it builds, so
none of them imports another."""

from __future__ import annotations

import torch

from cflpipe.errors import SpecError
from cflpipe.fl.distributed import DistributedTrainer
from cflpipe.fl.trainers import BatchedTrainer, ProcessesTrainer, SequentialTrainer, Trainer


# Models the batched trainer is measured faster for on a CPU (cflpipe bench --part trainers,
# docs/performance.md, per-tensor gradients): the cnn 2.0–3.4× on digits and 1.1–1.3× at 28×28,
# the mlp 1.0–1.5×, at 10–100 sampled clients; resnet18 0.6× at 32×32, so it stays sequential, as
# do the models not measured.
CPU_BATCHED_MODELS = ("cnn", "mlp")


def build_trainer(name: str, device: torch.device, model: str | None = None, where: str = "training.trainer",
                  workers: int | None = None, compiled: bool = False) -> Trainer:
    """The trainer `name` names: built in (auto picks sequential or batched; batched wherever
    the step is `compiled`), an installed plugin's (entry point group cflpipe.trainers) or a
    `module:Class` reference."""
    from cflpipe.plugins import (TRAINERS_GROUP, describe_object, entry_point_names, is_reference,
                                 load_entry_point, load_reference)

    if name == "auto":
        # On a GPU one vmapped loop replaces many small kernels; on a CPU only where measured.
        name = "batched" if compiled or device.type == "cuda" or model in CPU_BATCHED_MODELS else "sequential"
    if name == "processes":
        if device.type == "cuda":
            raise SpecError(f"{where}: processes spreads training over CPU processes; on a GPU use auto or batched")
        return ProcessesTrainer(workers or _usable_cpus())
    if name == "distributed":
        if device.type == "cuda":
            raise SpecError(f"{where}: distributed spreads training over the CPU processes torchrun starts, "
                            f"and this run's device is cuda; allowed: device: cpu, or trainer auto or batched on the GPU")
        return DistributedTrainer()
    if name == "batched":
        return BatchedTrainer(compiled)
    if name == "sequential":
        return SequentialTrainer()
    if is_reference(name):
        factory = load_reference(name, where)
    elif name in entry_point_names(TRAINERS_GROUP):
        factory = load_entry_point(TRAINERS_GROUP, name, where)
    else:
        raise SpecError(f"{where}: unknown trainer {name!r}; allowed: auto, sequential, batched, processes, distributed, "
                        f"{', '.join(entry_point_names(TRAINERS_GROUP))} or a module:Class reference")
    if not (isinstance(factory, type) and issubclass(factory, Trainer)):
        raise SpecError(f"{where}: {name!r} is {describe_object(factory)}, not a cflpipe.fl.trainers.Trainer subclass")
    return factory()


def _usable_cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
