"""Which trainer a run gets: `training.trainer` (auto: batched on a GPU or for a compiled step,
on a CPU the faster of sequential and batched as measured on the run's own plans), an installed
plugin's or a `module:Class` reference. Above the trainers it builds, so none of them imports
another."""

from __future__ import annotations

import errno
import json
import os
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Iterator

import torch

from cflpipe import store
from cflpipe.errors import SpecError
from cflpipe.fl.distributed import DistributedTrainer
from cflpipe.fl.params import ParamSpace
from cflpipe.fl.plan import Trained, trained_into
from cflpipe.fl.processes import ProcessesTrainer
from cflpipe.fl.trainers import BatchedTrainer, SequentialTrainer, Trainer
from cflpipe.fl.work import WorkItem
from cflpipe.spec._models import BUILTIN_TRAINERS

CACHE_ENV = "CFLPIPE_CACHE_DIR"
# One record of choices that several results folders share, in place of each folder's own (the
# conformance checks compare runs of two folders, which must not measure apart).
CHOICES_ENV = "CFLPIPE_TRAINER_CHOICES"
CHOICES_FILE = "trainer-choices.json"
# The batched trainer is taken only when it is this much faster: on a tie the sequential one
# streams FedAvg's uploads (less memory) and is the reference.
BATCHED_MARGIN = 1.02
# A measurement is repeated (in the other order) when the first pair took less than this many
# seconds, or when it was close (within CLOSE) and took less than LONG: one pair of a cheap round
# is at the mercy of a busy machine and of the process's first calls.
CHEAP, CLOSE, LONG = 2.0, 1.2, 20.0


def build_trainer(name: str, device: torch.device, model: str | None = None, where: str = "training.trainer",
                  workers: int | None = None, compiled: bool = False, recorded: Path | None = None) -> Trainer:
    """The trainer `name` names: built in (auto: batched on a GPU and wherever the step is
    `compiled`, on a CPU an AutoTrainer keeping its choices in `recorded`), an installed plugin's
    (entry point group cflpipe.trainers) or a `module:Class` reference. `model` is the run's model
    name (unused by the built-in trainers; kept for callers that pass it)."""
    from cflpipe.plugins import (TRAINERS_GROUP, describe_object, entry_point_names, is_reference,
                                 load_entry_point, load_reference)

    if name == "auto":
        # On a GPU one vmapped loop replaces many small kernels (2.8–37× on every built-in model,
        # docs/performance.md); on a CPU it depends on the shapes, so it is measured.
        if compiled or device.type == "cuda":
            name = "batched"
        else:
            return AutoTrainer(recorded)
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
        raise SpecError(f"{where}: unknown trainer {name!r}; allowed: "
                        f"{', '.join([*BUILTIN_TRAINERS, *entry_point_names(TRAINERS_GROUP)])} or a module:Class reference")
    if not (isinstance(factory, type) and issubclass(factory, Trainer)):
        raise SpecError(f"{where}: {name!r} is {describe_object(factory)}, not a cflpipe.fl.trainers.Trainer subclass")
    return factory()


class AutoTrainer(Trainer):
    """`trainer: auto` on a CPU: each call's work items go to the sequential or the batched
    trainer, whichever trains them faster on this machine.

    What decides is the call's shape (`plan_shape`: for each group the batched trainer would
    vmap, the network's parameter shapes, the input shape, batch size, clients and steps). The
    first time a shape is met on a machine (CPU model, core count, torch version and threads)
    both trainers train the items, timed, and the faster one's results are the call's: a run
    that measures gives the bytes of a run that named the winner.

    The choices are an input of the results, so they are kept with them: `recorded` (the spec's
    results folder's trainer-choices.json, by shape alone, with the machine that measured) is
    read first, so a rerun on a fresh home directory or on another node of a cluster trains every
    recorded shape as recorded and gives the same bytes; a machine measures only shapes nobody
    recorded. With a record, nothing else is read or written; without one (an AutoTrainer made
    outside a run) the choices are kept per user and machine in `choices_file()`
    (CFLPIPE_CACHE_DIR moves it). A run's checkpoint holds the choices it made, so a resumed run
    keeps them whatever the files say."""

    name = "auto"

    def __init__(self, recorded: Path | None = None) -> None:
        # counts are the two trainers' (a property), not a dict of its own
        self.recorded = None if recorded is None else shared_record(recorded)
        self.sequential, self.batched = SequentialTrainer(), BatchedTrainer()
        self.choices: dict[str, dict] = {}  # shape -> {"trainer", "by", seconds…} met by this run
        self.measured_since_asked = False

    @property
    def counts(self) -> dict[str, int]:
        return {k: self.sequential.counts[k] + self.batched.counts[k] for k in self.sequential.counts}

    def train(self, spaces, items):
        trainer, measured = self.decide(spaces, items)
        return measured if measured is not None else trainer.train(spaces, items)

    def train_each(self, spaces, items) -> Iterator[Trained]:
        trainer, measured = self.decide(spaces, items)
        yield from (measured if measured is not None else trainer.train_each(spaces, items))

    def apply(self, network, vectors, inputs, call="forward", chunk=None):
        return self.batched.apply(network, vectors, inputs, call, chunk)  # one by one on a CPU

    def took_measurement(self) -> bool:
        """Whether a call measured both trainers since the last time this was asked (the engine
        counts that round as a warm-up: it trained twice)."""
        measured, self.measured_since_asked = self.measured_since_asked, False
        return measured

    def state_dict(self) -> dict[str, str]:
        return {shape: choice["trainer"] for shape, choice in self.choices.items()}

    def load_state_dict(self, state: dict[str, str]) -> None:
        self.choices.update({shape: {"trainer": trainer, "by": "checkpoint"} for shape, trainer in state.items()})

    def decide(self, spaces: dict[str, ParamSpace], items: list[WorkItem]) -> tuple[Trainer, list[Trained] | None]:
        """The trainer for these items, and their results when deciding trained them."""
        shape = plan_shape(spaces, items)
        if shape is None:  # nothing the batched trainer would vmap: both train one by one
            return self.sequential, None
        if shape not in self.choices:
            key = machine_key() + " | " + shape
            # a run with a results folder reads its record alone: the per-user cache is for runs without one
            recorded = read_choices(self.recorded, results=True).get(shape) if self.recorded is not None else None
            cached = read_choices().get(key) if self.recorded is None else None
            if _usable(recorded):
                self.choices[shape] = {**recorded, "by": "recorded"}
            elif _usable(cached):
                kept = self._record(shape, cached)  # another node may have recorded the shape meanwhile
                self.choices[shape] = {**kept, "by": "cached" if kept["trainer"] == cached["trainer"] else "recorded"}
            else:
                return self.measure(spaces, items, shape, key)
        trainer = self.choices[shape]["trainer"]
        return (self.batched if trainer == "batched" else self.sequential), None

    def measure(self, spaces, items, shape: str, key: str) -> tuple[Trainer, list[Trained]]:
        """Both trainers on the items from the same state (parameter spaces, torch's RNG), timed;
        the state and counts left as the chosen trainer leaves them, its results returned."""
        loose = [replace(item, into=None) for item in items]  # `into` may be an item's own start
        before = _snapshot(spaces)
        counts = {name: dict(t.counts) for name, t in (("sequential", self.sequential), ("batched", self.batched))}
        runs: dict[str, dict] = {}
        order = ["sequential", "batched"]
        while True:
            for name in order:
                _restore(spaces, before)
                trainer = self.sequential if name == "sequential" else self.batched
                start = _clock()
                trained = trainer.train(spaces, loose)
                seconds = _clock() - start
                if name in runs:
                    runs[name]["seconds"] = min(runs[name]["seconds"], seconds)
                else:
                    runs[name] = {"trained": trained, "seconds": seconds, "after": _snapshot(spaces),
                                  "counts": dict(trainer.counts)}
                trainer.counts = dict(counts[name])
            first_pair = runs["sequential"]["seconds"] + runs["batched"]["seconds"]
            ratio = max(runs["sequential"]["seconds"], runs["batched"]["seconds"]) / \
                max(min(runs["sequential"]["seconds"], runs["batched"]["seconds"]), 1e-9)
            if order[0] == "batched" or not (first_pair < CHEAP or (ratio < CLOSE and first_pair < LONG)):
                break
            order = ["batched", "sequential"]
        chosen = "batched" if runs["batched"]["seconds"] * BATCHED_MARGIN < runs["sequential"]["seconds"] else "sequential"
        choice = {"trainer": chosen, "sequential_seconds": round(runs["sequential"]["seconds"], 6),
                  "batched_seconds": round(runs["batched"]["seconds"], 6)}
        # another process may have recorded this shape meanwhile
        kept = record_choice(key, choice) if self.recorded is None else choice
        by = "measured" if kept is choice else "cached"
        recorded = self._record(shape, kept)  # or a run of this results folder, on another machine
        if recorded["trainer"] != kept["trainer"]:
            kept, by = recorded, "recorded"
        chosen = kept["trainer"]
        self.choices[shape] = {**kept, "by": by}
        self.measured_since_asked = True
        winner = runs[chosen]
        _restore(spaces, winner["after"])
        trainer = self.sequential if chosen == "sequential" else self.batched
        trainer.counts = winner["counts"]
        return trainer, [Trained(trained_into(item, t.vector, t.result), t.result, t.companions)
                         for item, t in zip(items, winner["trained"])]

    def _record(self, shape: str, choice: dict) -> dict:
        """Keep `choice` in the results folder's record unless the shape is there already."""
        if self.recorded is None:
            return choice
        return record_choice(shape, {**choice, "machine": choice.get("machine", machine_key())}, self.recorded,
                             results=True)


def _usable(choice) -> bool:
    return isinstance(choice, dict) and choice.get("trainer") in ("sequential", "batched")


def plan_shape(spaces: dict[str, ParamSpace], items: list[WorkItem]) -> str | None:
    """What the cost of training `items` depends on: for each group of two or more items the
    batched trainer would vmap (its grouping), the network (parameter shapes), input shape,
    batch size, step rule, anchors and companions, group size and steps (as the powers of two around
    them); None
    when no group has two items."""
    groups: dict[tuple, list[int]] = {}
    for i, item in enumerate(items):
        key = BatchedTrainer.group_key(item)
        if key is not None:
            groups.setdefault(key, []).append(i)
    described = []
    for members in groups.values():
        for bucket in BatchedTrainer.step_buckets(items, members):
            for chunk in BatchedTrainer.memory_chunks(spaces, items, bucket):
                if len(chunk) < 2:
                    continue
                first = items[chunk[0]]
                steps = sorted(items[i].steps for i in chunk)
                space = spaces[first.network]
                network = "+".join("x".join(map(str, s.shape)) for s in space.slots)
                extras = [type(first.rule).__name__, *(["anchors %d" % len(first.anchors)] if first.anchors else []),
                          *(["companions " + "+".join(sorted(first.companions))] if first.companions else [])]
                described.append(f"{type(space.model).__name__}[{network}] in {'x'.join(map(str, first.x.shape[1:]))} "
                                 f"{str(first.x.dtype).removeprefix('torch.')} batch {min(first.batch_size, len(first.y))} "
                                 f"{first.precision} {' '.join(extras)} clients {_span([len(chunk)])} "
                                 f"steps {_span(steps)}")
    return "; ".join(sorted(described)) or None


def _span(counts: list[int]) -> str:
    """Sorted counts as the powers of two around them (`8-16`): nearby counts cost alike, and a
    round of partial participation or unequal clients should not be a new shape every time."""
    low, high = 1 << (counts[0].bit_length() - 1), 1 << (counts[-1] - 1).bit_length()
    return str(low) if low == high else f"{low}-{high}"


def machine_key() -> str:
    """The machine as far as the trainers' speed goes: CPU model and cores, torch and its threads."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model} ({os.cpu_count()} cpus) torch {torch.__version__} threads {torch.get_num_threads()}"


def shared_record(recorded: Path) -> Path:
    """The record a results folder's runs keep their choices in: its own (`recorded`), or the one
    CFLPIPE_TRAINER_CHOICES names."""
    return Path(os.environ.get(CHOICES_ENV) or recorded)


def choices_file() -> Path:
    """Where measured choices are kept: $CFLPIPE_CACHE_DIR, else $XDG_CACHE_HOME/cflpipe, else
    ~/.cache/cflpipe."""
    folder = os.environ.get(CACHE_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "cflpipe")
    return Path(folder) / CHOICES_FILE


def read_choices(path: Path | None = None, results: bool = False) -> dict[str, dict]:
    """The choices kept in `path` (default: the per-user `choices_file()`). A results folder's
    record that cannot be read as choices is an error (rewriting it would drop every choice its
    runs were made with); a damaged per-user cache is empty."""
    target = path or choices_file()
    if results:  # shared with the runs that may be writing it (record_choice)
        try:
            with store.locked_record(target, exclusive=False) as handle:
                return _results_record(handle.read() if handle is not None else "", target)
        except OSError as exc:
            raise _not_a_record(target, exc) from None
    try:
        data = json.loads(target.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _results_record(text: str, path: Path) -> dict[str, dict]:
    """A results folder's record from its text: empty is none yet (a writer's a+ makes the file
    before it takes the lock); anything but a JSON object of shapes is an error."""
    try:
        data = json.loads(text) if text.strip() else {}
    except ValueError as exc:
        raise _not_a_record(path, exc) from None
    if not isinstance(data, dict):
        raise _not_a_record(path, "a JSON object of shapes")
    return data


def _not_a_record(path: Path, why: object) -> SpecError:
    return SpecError(f"{path}: not a record of trainer choices ({why}); restore it from the results' copy, or "
                     f"delete it to measure again (reruns may then differ in the last bits)")


_said_unwritable = False


def record_choice(key: str, choice: dict, path: Path | None = None, results: bool = False) -> dict:
    """Keep `choice` for `key` in `path` (default: the per-user `choices_file()`) unless one is
    kept already (a process that measured the same shape at the same time), under a lock; the
    choice kept is returned. A per-user cache that cannot be written is said once and the choice
    used for this process alone; a results folder's record that cannot be written fails as any
    of the results' files does."""
    global _said_unwritable
    if results:
        return _record_in_results(key, choice, path)
    path = path or choices_file()
    try:
        with store.waiting_lock(path.with_name(path.name + ".lock")):
            kept = read_choices(path, results)
            if _usable(kept.get(key)):
                return kept[key]
            kept[key] = {**choice, "measured": choice.get("measured", time.strftime("%Y-%m-%d"))}
            store.write_text(path, json.dumps(kept, indent=1, sort_keys=True))
    except OSError as exc:
        if results:
            raise
        # A full disk is said once, by the results' own write (one line), not here as well.
        if not _said_unwritable and exc.errno != errno.ENOSPC:
            _said_unwritable = True
            print(f"cflpipe: {path}: cannot keep the measured trainer choice ({exc.strerror or exc}); "
                  f"trainer: auto measures again in the next process", file=sys.stderr)
    return choice


def _record_in_results(key: str, choice: dict, path: Path) -> dict:
    """record_choice for a results folder's record: the record itself locked and rewritten in
    place, so the results hold no lock file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with store.locked_record(path, exclusive=True) as handle:
        kept = _results_record(handle.read(), path)
        if _usable(kept.get(key)):
            return kept[key]
        kept[key] = {**choice, "measured": choice.get("measured", time.strftime("%Y-%m-%d"))}
        store.rewrite_locked(handle, json.dumps(kept, indent=1, sort_keys=True))
    return choice


def _clock() -> float:
    # One torch thread: the process's CPU time, which another job on the machine does not inflate.
    return time.process_time() if torch.get_num_threads() == 1 else time.perf_counter()


def _snapshot(spaces: dict[str, ParamSpace]) -> tuple:
    return ({name: (space.flat.detach().clone(), space.grad.detach().clone()) for name, space in spaces.items()},
            torch.get_rng_state())


def _restore(spaces: dict[str, ParamSpace], snapshot: tuple) -> None:
    tensors, rng = snapshot
    with torch.no_grad():
        for name, (flat, grad) in tensors.items():
            spaces[name].flat.copy_(flat)
            spaces[name].grad.copy_(grad)
    torch.set_rng_state(rng)


def _usable_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
