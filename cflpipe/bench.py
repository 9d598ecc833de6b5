"""`cflpipe bench`: the engine's cost against the pure cost of the same local SGD steps, the
batched trainer against the sequential one, and evaluation's cost by chunk size.

For each standard workload the engine runs FedAvg with evaluation only at the last round; the
training rounds' wall time is compared with a tight loop that performs exactly the same SGD steps
(same clients, same batches, same model) with torch.optim.SGD on one plain module. The ratio is
the engine's overhead; anything much above 1 is a bug. Per-round time is also measured at two
population sizes with the same number of sampled clients: it should not grow with the population.

Trainers: FedAvg over 100 clients (5 local steps of batch 8) with the mlp and the cnn on digits,
the cnn, a PFLlib-sized plug-in CNN and resnet18 on random images of MNIST's and CIFAR's shapes,
10 to 100 sampled clients per round, `trainer: sequential`, `batched` and `auto`: median
training ms per round (evaluation only at the last round, left out), their ratio, what auto
chose and its time over the better of the two.
Steps: the same where clients' step counts differ (`local_epochs` over Dirichlet clients).

Evaluation: `eval_batch_size` 8192 (one forward pass per split, as before chunking) against the
default 256, in the engine on the digits cnn workload and for `predict` at MNIST/CIFAR shapes.

Applying models: one evaluation round of IFCA (K = 4) and of Ditto at 100 clients, the models
applied one by one against one vmap over the stacked models (Trainer.apply).

Scale (`--part scale`, not run by default): one evaluation round of FedAvg and IFCA at 1,000 and
10,000 clients, every client against a seeded sample of 100 (training.eval_clients).

Yardstick (`--part yardstick`, not run by default): pfl-research's CIFAR-10 benchmark shape, per
trainer and, with --precision and --compile, per training.precision and compiled step.
"""

from __future__ import annotations

import json
import resource
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from cflpipe.fl.data import build_federated_data
from cflpipe.fl.engine import train_run
from cflpipe.fl.local import batch_indices, steps_for
from cflpipe.seeds import mix_seed as _mix
from cflpipe.models import LayeredModel, build_model
from cflpipe.spec import parse_spec

WORKLOADS = {
    # FedAC's shape on the embedded digits: 100 clients, 25 per round, 5 local steps, batch 32.
    "digits": {"dataset": "digits", "model": "cnn", "clients": [100], "partition": [{"kind": "iid"}]},
    # LEAF Synthetic with one client per device; 100 vs 1,000 devices, 25 sampled either way.
    "synthetic": {"dataset": {"name": "synthetic", "devices": None, "max_samples": 200}, "model": "mlp",
                  "clients": [100, 1000], "partition": [{"kind": "natural"}]},
}


def _spec(name: str, clients: int, rounds: int, results: Path):
    w = WORKLOADS[name]
    dataset = w["dataset"]
    if isinstance(dataset, dict):
        dataset = {**dataset, "devices": clients}
    return parse_spec({
        "seeds": [0],
        "training": {"model": w["model"], "rounds": rounds, "clients_per_round": 25, "local_steps": 5,
                     "batch_size": 32, "lr": 0.05, "eval_every": rounds + 1, "checkpoint_every": rounds + 1,
                     "device": "cpu", "trainer": "sequential"},  # the tight loop is sequential too
        "scenarios": {"bench": {"dataset": dataset, "clients": clients, "partition": w["partition"]}},
        "methods": {"fedavg": {}},
        "results_dir": str(results),
    })


def tight_loop_seconds(spec, rounds: int) -> list[float]:
    """The same SGD steps as the engine's FedAvg rounds, on one plain module with torch.optim."""
    training = spec.resolved_training("bench", "fedavg")
    data = build_federated_data(spec, "bench", torch.device("cpu"))
    torch.manual_seed(0)
    model = build_model(training.model, data.input_shape, data.num_classes)
    start = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=training.lr)
    per_round = []
    for r in range(rounds - 1):  # the engine's last round also evaluates; it is left out there too
        rng = np.random.default_rng([0, r, 0x5A])
        sampled = np.sort(rng.choice(data.num_clients, size=training.clients_per_round, replace=False))
        t0 = time.perf_counter()
        for client in sampled:
            x, y = data.client(int(client))
            steps = steps_for(len(y), training.batch_size, training.local_steps, training.local_epochs)
            generator = torch.Generator().manual_seed(_mix(0, r, int(client)))
            batches = batch_indices(len(y), training.batch_size, steps, generator)
            with torch.no_grad():
                for p, s in zip(model.parameters(), start):
                    p.copy_(s)
            model.train()
            for batch in batches:
                optimizer.zero_grad()
                F.cross_entropy(model(x[batch]), y[batch]).backward()
                optimizer.step()
        per_round.append(time.perf_counter() - t0)
    return per_round


def bench_workload(name: str, clients: int, rounds: int, repeats: int = 3) -> dict:
    """Engine and tight loop alternate `repeats` times; each side keeps its fastest repeat's
    median round, which filters out the noise of a shared machine."""
    engine_runs, tight_runs, bookkeeping = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        spec = _spec(name, clients, rounds, Path(tmp))
        for _ in range(repeats):
            tight_runs.append(float(np.median(tight_loop_seconds(spec, rounds))))
            train_run(spec, "bench", "fedavg", 0, force=True, progress=False)
            timing = pd.read_parquet(spec.run_dir("bench", "fedavg", 0) / "timing.parquet").iloc[:-1]
            # The last round carries the one evaluation and is left out.
            engine_runs.append(float(np.median(timing["train_seconds"] + timing["server_seconds"])))
            bookkeeping.append(float(np.median(timing["seconds"])))
    engine, tight = min(engine_runs), min(tight_runs)
    return {
        "workload": name, "clients": clients, "clients_per_round": 25, "rounds": rounds,
        "engine_seconds_per_round": engine,
        "round_seconds_incl_bookkeeping": min(bookkeeping),
        "tight_loop_seconds_per_round": tight,
        "overhead_ratio": engine / tight,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def _digits_fedavg(results: Path, model: str, sampled: int, rounds: int, **training):
    return parse_spec(_fedavg_spec(results, model, sampled, rounds, **training))


def _fedavg_spec(results: Path, model: str, sampled: int, rounds: int, **training) -> dict:
    return {
        "seeds": [0],
        "training": {"model": model, "rounds": rounds, "clients_per_round": sampled, "local_steps": 5,
                     "batch_size": 8, "lr": 0.05, "eval_every": rounds + 1, "checkpoint_every": rounds + 1,
                     "device": "cpu", **training},  # a `device` in `training` replaces the default
        "scenarios": {"bench": {"dataset": "digits", "clients": 100, "partition": [{"kind": "iid"}]}},
        "methods": {"fedavg": {}},
        "results_dir": str(results),
    }


def _median_timing(spec, column: str, drop_last: bool) -> float:
    train_run(spec, "bench", "fedavg", 0, force=True, progress=False)
    timing = pd.read_parquet(spec.run_dir("bench", "fedavg", 0) / "timing.parquet")
    if drop_last:
        timing = timing.iloc[:-1]
    return float(np.median(timing[column]))


# The trainers' workloads: each built-in image model at the input shapes it meets (digits' 8×8;
# MNIST's 28×28 and CIFAR's 32×32 as random images of those shapes: timing needs no real data),
# and a plug-in model the size of PFLlib's MNIST CNN (by reference), with the sampled-client
# counts measured and training settings beyond the defaults (5 local steps of batch 8).
TRAINER_WORKLOADS = (
    ("mlp", None, (10, 25, 100), {}),
    ("cnn", None, (10, 25, 100), {}),
    ("cnn", (1, 28, 28), (10, 25), {}),
    ("cflpipe.bench:PFLlibCNN", (1, 28, 28), (10, 20), {"batch_size": 10}),
    ("resnet18", (3, 32, 32), (10,), {"rounds": 4}),  # seconds a round: fewer of them
)


class PFLlibCNN(LayeredModel):
    """PFLlib's FedAvgCNN at MNIST's shape (two unpadded 5×5 convs of 32 and 64 channels, each
    followed by a 2×2 max-pool, a 512-unit hidden layer; 582,026 parameters): the bench's stand-in
    for a plug-in model that no name tells apart from a small one."""

    name = "pfllib_cnn"

    def __init__(self, input_shape: tuple[int, ...], num_classes: int):
        super().__init__(input_shape, num_classes)
        channels, height, width = input_shape
        self.conv1 = torch.nn.Conv2d(channels, 32, 5)
        self.conv2 = torch.nn.Conv2d(32, 64, 5)
        h, w = ((height - 4) // 2 - 4) // 2, ((width - 4) // 2 - 4) // 2
        self.fc1 = torch.nn.Linear(64 * h * w, 512)
        self.fc = torch.nn.Linear(512, num_classes)
        self.layers = ["conv1", "conv2", "fc1", "fc"]

    def features(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = F.max_pool2d(torch.relu(self.conv2(x)), 2)
        return torch.relu(self.fc1(torch.flatten(x, 1)))


def _images_fedavg(results: Path, model: str, shape: tuple[int, ...], sampled: int, rounds: int, **training):
    """FedAvg over 100 clients of random images of `shape` (10 classes), from a .npz beside the results."""
    path = results.parent / f"images-{'x'.join(map(str, shape))}.npz"
    if not path.exists():
        rng = np.random.default_rng(0)
        np.savez(path, x_train=rng.standard_normal((2000, *shape), dtype=np.float32),
                 y_train=rng.integers(0, 10, 2000), x_test=rng.standard_normal((200, *shape), dtype=np.float32),
                 y_test=rng.integers(0, 10, 200))
    spec = _fedavg_spec(results, model, sampled, rounds, **training)
    spec["scenarios"]["bench"]["dataset"] = {"name": "files", "path": str(path), "classes": 10}
    return spec


BENCH_TRAINERS = ("sequential", "batched", "auto")


def _trainer_times(make_spec, repeats: int) -> dict[str, float]:
    """Median training seconds per round (the last, evaluated round left out) of each of
    BENCH_TRAINERS on the spec `make_spec(folder, trainer)` makes, fastest of `repeats`
    alternating runs; auto starts from an empty record of choices (its first run measures, later
    ones read the choice), and the trainer it chose is returned as well ("auto_choice")."""
    import os

    from cflpipe.fl.trainer_choice import CHOICES_ENV

    seconds: dict[str, list[float]] = {trainer: [] for trainer in BENCH_TRAINERS}
    choice = ""
    with tempfile.TemporaryDirectory() as tmp:
        before = os.environ.get(CHOICES_ENV)  # one record, empty, whatever the environment shares
        os.environ[CHOICES_ENV] = str(Path(tmp) / "trainer-choices.json")
        try:
            for _ in range(repeats):
                for trainer in seconds:
                    spec = parse_spec(make_spec(Path(tmp) / trainer, trainer))
                    seconds[trainer].append(_median_timing(spec, "train_seconds", drop_last=True))
                    if trainer == "auto":
                        choices = json.loads((spec.run_dir("bench", "fedavg", 0) / "timing.json").read_text())
                        choice = "+".join(sorted({c["trainer"] for c in choices.get("auto_choices", {}).values()}))
        finally:
            if before is None:
                os.environ.pop(CHOICES_ENV, None)
            else:
                os.environ[CHOICES_ENV] = before
    best = {trainer: min(times) for trainer, times in seconds.items()}
    return {**best, "auto_choice": choice or "sequential"}  # no shape to choose for: one by one


def _trainer_row(times: dict, **row) -> dict:
    seq, bat, auto = times["sequential"], times["batched"], times["auto"]
    return {**row, "sequential_ms_per_round": seq * 1000, "batched_ms_per_round": bat * 1000,
            "speedup": seq / bat, "auto_ms_per_round": auto * 1000, "auto": times["auto_choice"],
            "auto_over_best": auto / min(seq, bat)}


def _say_trainers(label: str, row: dict) -> None:
    print(f"{label}  sequential {row['sequential_ms_per_round']:8.1f} ms/round  batched "
          f"{row['batched_ms_per_round']:8.1f} ms/round  speed-up ×{row['speedup']:.2f}  auto "
          f"{row['auto_ms_per_round']:8.1f} ms/round ({row['auto']}, ×{row['auto_over_best']:.2f} the better)",
          flush=True)


def bench_trainers(workloads=TRAINER_WORKLOADS, rounds: int = 10, repeats: int = 3, device: str = "cpu") -> list[dict]:
    """Median training seconds per round of the sequential, the batched and the auto trainer, what
    auto picks on `device`, and auto's time over the better of the two."""
    rows = []
    for model, shape, sampled, settings in workloads:
        where = "digits 8x8" if shape is None else "x".join(map(str, shape))
        training = {k: v for k, v in settings.items() if k != "rounds"}
        for k in sampled:
            def make_spec(results, trainer, model=model, shape=shape, k=k, training=training,
                          rounds=settings.get("rounds", rounds)):
                settings = {**training, "trainer": trainer, "device": device}
                return (_fedavg_spec(results, model, k, rounds, **settings) if shape is None else
                        _images_fedavg(results, model, shape, k, rounds, **settings))

            row = _trainer_row(_trainer_times(make_spec, repeats), model=model.rsplit(":", 1)[-1], input=where,
                               clients_per_round=k, device=device, **training)
            rows.append(row)
            _say_trainers(f"trainer   {row['model']:10s} {where:10s} sampled={k:4d}", row)
    return rows


# Where clients' step counts differ: one local epoch over Dirichlet clients, all sampled.
STEPS_WORKLOADS = (
    ("mlp", None, 0.3, 16),
    ("cnn", None, 0.3, 16),
    ("cnn", (1, 28, 28), 0.5, 16),
)


def bench_steps(rounds: int = 8, repeats: int = 3, device: str = "cpu") -> list[dict]:
    """The trainers where clients' step counts differ: 20 Dirichlet clients (digits at α 0.3: 18
    to 170 training rows; random 28×28 images at α 0.5), all sampled, one local epoch of batch
    16, so the batched trainer groups clients by step count within 2× and undoes the extra steps
    of the shorter ones. Median training seconds per round, fastest of `repeats` alternating
    runs, and auto's pick and time."""
    rows = []
    for model, shape, alpha, batch in STEPS_WORKLOADS:
        def make_spec(results, trainer, model=model, shape=shape, alpha=alpha, batch=batch):
            settings = {"trainer": trainer, "device": device, "local_epochs": 1, "batch_size": batch}
            data = (_fedavg_spec(results, model, 20, rounds, **settings) if shape is None else
                    _images_fedavg(results, model, shape, 20, rounds, **settings))
            data["training"].pop("local_steps")
            data["scenarios"]["bench"].update(clients=20, partition=[{"kind": "dirichlet", "alpha": alpha}])
            return data

        where = "digits 8x8" if shape is None else "x".join(map(str, shape))
        row = _trainer_row(_trainer_times(make_spec, repeats), model=model, input=where, alpha=alpha,
                           device=device, clients_per_round=20)
        rows.append(row)
        _say_trainers(f"steps     {model:8s} {where:10s} dirichlet({alpha}) 20 clients, 1 epoch", row)
    return rows


def bench_eval(rounds: int = 6, repeats: int = 3) -> list[dict]:
    """Evaluation in one forward pass per split (8192) vs chunks of 256: the engine's median
    evaluation time per round on the digits cnn workload (8×8 inputs), and `predict` alone on
    10,000 random inputs of the cnn at MNIST (1×28×28) and CIFAR (3×32×32) shape, where
    evaluation costs most."""
    from cflpipe.fl.local import predict
    from cflpipe.fl.params import ParamSpace

    rows = []
    seconds = {8192: [], 256: []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(repeats):
            for chunk in seconds:
                spec = _digits_fedavg(Path(tmp) / str(chunk), "cnn", 25, rounds, eval_every=1,
                                      eval_batch_size=chunk, trainer="sequential")
                seconds[chunk].append(_median_timing(spec, "eval_seconds", drop_last=False))
    rows.append({"workload": "digits cnn, engine evaluation per round", "one_pass_ms": min(seconds[8192]) * 1000,
                 "chunked_256_ms": min(seconds[256]) * 1000})
    for shape in ((1, 28, 28), (3, 32, 32)):
        torch.manual_seed(0)
        space = ParamSpace(build_model("cnn", shape, 10))
        x, y = torch.randn(10_000, *shape), torch.randint(0, 10, (10_000,))
        best = {}
        for chunk in (8192, 256):
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                predict(space, x, y, chunk)
                times.append(time.perf_counter() - t0)
            best[chunk] = min(times)
        rows.append({"workload": f"cnn {'x'.join(map(str, shape))}, predict 10,000 inputs",
                     "one_pass_ms": best[8192] * 1000, "chunked_256_ms": best[256] * 1000})
    for row in rows:
        row["speedup"] = row["one_pass_ms"] / row["chunked_256_ms"]
        print(f"eval      {row['workload']:42s} one pass {row['one_pass_ms']:8.1f} ms  chunks of 256 "
              f"{row['chunked_256_ms']:8.1f} ms  speed-up ×{row['speedup']:.2f}", flush=True)
    return rows


def bench_apply(repeats: int = 3, clients: int = 100, device: str = "cpu") -> list[dict]:
    """One evaluation round of a K = 4 cluster method (IFCA: 4 cluster models on the pooled test
    data, and its cluster choice by loss on the pooled training data) and of Ditto (a personal
    model per client on its own rows), at `clients` digits clients, with the models applied one by
    one (the sequential trainer, how evaluation always ran before Trainer.apply) and as one vmap
    over the stacked models (the batched trainer); fastest of `repeats` alternating runs."""
    from cflpipe.fl.engine import prepare_run

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in ("mlp", "cnn"):
            for method, hyperparams in (("ifca", {"clusters": 4}), ("ditto", {})):
                seconds: dict[str, list[float]] = {"sequential": [], "batched": []}
                for _ in range(repeats):
                    for trainer in seconds:
                        spec = parse_spec({
                            "seeds": [0],
                            "training": {"model": model, "rounds": 1, "clients_per_round": 10, "device": device,
                                         "trainer": trainer},
                            "scenarios": {"bench": {"dataset": "digits", "clients": clients,
                                                    "partition": [{"kind": "iid"},
                                                                  {"kind": "label_swap", "groups": 4}]}},
                            "methods": {method: hyperparams},
                            "results_dir": str(Path(tmp) / trainer)})
                        run = prepare_run(spec, "bench", method, 0)
                        t0 = time.perf_counter()
                        run.evaluate(1)
                        _synchronize(device)
                        seconds[trainer].append(time.perf_counter() - t0)
                one, together = min(seconds["sequential"]), min(seconds["batched"])
                rows.append({"model": model, "method": method, "clients": clients, "device": device,
                             "one_by_one_ms": one * 1000, "batched_ms": together * 1000, "speedup": one / together})
                print(f"apply     {model:4s} {method:6s} clients={clients:4d}  one by one {one * 1000:8.1f} ms  "
                      f"batched {together * 1000:8.1f} ms  speed-up ×{one / together:.2f}", flush=True)
    return rows


# A sampled evaluation's clients (training.eval_clients) in bench_scale.
SCALE_SAMPLE = 100


# The largest population the full-against-sampled part evaluates every client of.
FULL_EVAL_MAX = 10_000

# The methods of the full-against-sampled evaluation part, with their hyper-parameters.
SCALE_METHODS = {"fedavg": {}, "ifca": {"clusters": 4}}


def bench_scale(populations: tuple[int, ...] = (1000, 10000), repeats: int = 2, device: str = "cpu",
                methods: list[str] | None = None) -> list[dict]:
    """One evaluation round of FedAvg and of IFCA (K = 4) on LEAF Synthetic with one client per
    device (the mlp; 200 samples a device at most), every client against a seeded sample of
    SCALE_SAMPLE (training.eval_clients); the fastest of `repeats` alternating runs."""
    from cflpipe.fl.engine import prepare_run

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for clients in populations:
            for method, hyperparams in SCALE_METHODS.items():
                if methods is not None and method not in methods:
                    continue
                seconds: dict[str, list[float]] = {"full": [], "sampled": []}
                for _ in range(repeats):
                    for kind in seconds:
                        sample = {"eval_clients": SCALE_SAMPLE} if kind == "sampled" else {}
                        spec = parse_spec({
                            "seeds": [0],
                            # Round 1 of 2 is a sampled evaluation; of 1, the last, a full one.
                            # "full": every client (not full_eval_clients auto's sample of them)
                            "training": {"model": "mlp", "rounds": 2 if sample else 1, "clients_per_round": 10,
                                         "device": device, "full_eval_clients": "all", **sample},
                            "scenarios": {"bench": {"dataset": {"name": "synthetic", "devices": clients,
                                                                "max_samples": 200},
                                                    "clients": clients, "partition": [{"kind": "natural"}]}},
                            "methods": {method: hyperparams},
                            "results_dir": str(Path(tmp) / kind), "data_dir": str(Path(tmp) / "data")})
                        run = prepare_run(spec, "bench", method, 0)
                        t0 = time.perf_counter()
                        figures = run.evaluate(1)
                        _synchronize(device)
                        seconds[kind].append(time.perf_counter() - t0)
                        assert figures.get("evaluated_clients", clients) == (SCALE_SAMPLE if sample else clients)
                full, sampled = min(seconds["full"]), min(seconds["sampled"])
                rows.append({"method": method, "clients": clients, "sample": SCALE_SAMPLE, "device": device,
                             "full_s": full, "sampled_s": sampled, "speedup": full / sampled})
                print(f"scale     {method:6s} clients={clients:6d}  full {full:7.2f} s  sample of {SCALE_SAMPLE} "
                      f"{sampled:7.3f} s  ×{full / sampled:.1f}", flush=True)
    return rows


def _synchronize(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


# pfl-research's CIFAR-10 benchmark (Granlund et al. 2024, benchmarks/image_classification):
# 1,000 users of 50 images, 50 users per round, one local epoch of batch 10 (5 steps), its
# 1.63 M-parameter simple CNN. Published, so cflpipe's per-round cost can be set beside it. Here a
# user gets 60 images of CIFAR-10's 60,000 (train and test pooled, cflpipe's default), 48 for
# training: the same 5 steps of 10 per round; 12 for its test split.
YARDSTICK = {"users": 1000, "images_per_user": 50, "users_per_round": 50, "batch_size": 10,
             "local_epochs": 1, "model": "cnn_pfl", "shape": (3, 32, 32), "classes": 10}


class _GpuSampler:
    """Samples GPU utilisation (%) every 0.1 s in a thread while the yardstick trains (NVML,
    through torch.cuda.utilization); none on a CPU or where NVML is missing."""

    def __init__(self, device: torch.device):
        import threading

        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = None
        if device.type == "cuda":
            try:
                torch.cuda.utilization(device)
            except Exception:  # no NVML: report no utilisation rather than fail the benchmark
                return
            self._thread = threading.Thread(target=self._sample, args=(device,), daemon=True)

    def _sample(self, device: torch.device) -> None:
        while not self._stop.wait(0.1):
            self.samples.append(torch.cuda.utilization(device))

    def __enter__(self):
        if self._thread is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def mean(self) -> float | None:
        return float(np.mean(self.samples)) if self.samples else None


def _yardstick_dataset(folder: Path, data_dir: str, users: int) -> dict:
    """CIFAR-10 when it is downloaded under `data_dir`, else random images of its shape and size
    (timing needs no real pixels; accuracy is then chance)."""
    from cflpipe.data.download import is_complete

    if is_complete("cifar10", data_dir) and users <= 1000:  # 60 images a user
        return {"name": "cifar10"}
    path = folder / f"cifar-shaped-{users}.npz"
    if not path.exists():
        rng = np.random.default_rng(0)
        train, test = users * 50, users * 10  # CIFAR-10's proportions: 60 images a user
        np.savez(path, x_train=rng.standard_normal((train, *YARDSTICK["shape"]), dtype=np.float32),
                 y_train=rng.integers(0, YARDSTICK["classes"], train),
                 x_test=rng.standard_normal((test, *YARDSTICK["shape"]), dtype=np.float32),
                 y_test=rng.integers(0, YARDSTICK["classes"], test))
    return {"name": "files", "path": str(path), "classes": YARDSTICK["classes"]}


def bench_yardstick(rounds: int = 10, device: str = "cpu", trainers=("sequential", "batched"),
                    users: int = YARDSTICK["users"], data_dir: str = "resources/datasets",
                    precisions=("float32",), compiled: bool = False) -> list[dict]:
    """FedAvg on pfl-research's CIFAR-10 benchmark shape (YARDSTICK) with each trainer: rounds/s,
    client-steps/s and samples/s from the median round (the first, warming up, and the last, which
    evaluates every client, left out), the final evaluation's time, and on CUDA the mean GPU
    utilisation and peak GPU memory; peak RSS is the process's so far (it includes the runs
    before). Each trainer runs once per entry of `precisions` (training.precision); `compiled`
    sets training.compile for the batched trainer (its compilation falls in the first round,
    which is left out of the median, and in wall_seconds)."""
    users_per_round = min(YARDSTICK["users_per_round"], users)
    steps_per_client = YARDSTICK["images_per_user"] // YARDSTICK["batch_size"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        dataset = _yardstick_dataset(Path(tmp), data_dir, users)
        for trainer, precision in [(t, p) for t in trainers for p in precisions]:
            compile_step = compiled and trainer == "batched"  # the sequential trainer has no step to compile
            spec = parse_spec({
                "seeds": [0],
                "training": {"model": YARDSTICK["model"], "rounds": rounds, "clients_per_round": users_per_round,
                             "local_epochs": YARDSTICK["local_epochs"], "batch_size": YARDSTICK["batch_size"],
                             "lr": 0.05, "eval_every": rounds + 1, "checkpoint_every": rounds + 1,
                             "device": device, "trainer": trainer, "precision": precision,
                             "compile": compile_step},
                "scenarios": {"yardstick": {"dataset": dataset, "clients": users, "partition": [{"kind": "iid"}]}},
                "methods": {"fedavg": {}}, "results_dir": str(Path(tmp) / f"{trainer}-{precision}"), "data_dir": data_dir})
            on = torch.device(device if device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
            if on.type == "cuda":
                torch.cuda.reset_peak_memory_stats(on)
            t0 = time.perf_counter()
            with _GpuSampler(on) as gpu:
                result = train_run(spec, "yardstick", "fedavg", 0, force=True, progress=False)
            wall = time.perf_counter() - t0
            timing = pd.read_parquet(result.run_dir / "timing.parquet")
            middle = timing.iloc[1:-1] if len(timing) > 2 else timing
            per_round = float(np.median(middle["seconds"]))
            row = {"trainer": trainer, "precision": precision, "compiled": compile_step,
                   "device": str(on), "data": dataset["name"], "users": users,
                   "users_per_round": users_per_round, "rounds": rounds,
                   "seconds_per_round": per_round, "rounds_per_second": 1 / per_round,
                   "client_steps_per_second": users_per_round * steps_per_client / per_round,
                   "samples_per_second": users_per_round * YARDSTICK["images_per_user"] / per_round,
                   "final_eval_seconds": float(timing["eval_seconds"].iloc[-1]), "wall_seconds": wall,
                   "final_accuracy": result.summary.get("final", {}).get("acc_macro"),
                   "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                   "gpu_utilisation_percent": gpu.mean(),
                   "gpu_peak_memory_mib": torch.cuda.max_memory_allocated(on) / 2**20 if on.type == "cuda" else None}
            rows.append(row)
            extra = (f"  GPU {row['gpu_utilisation_percent'] or float('nan'):.0f}% busy, "
                     f"{row['gpu_peak_memory_mib']:.0f} MiB peak" if on.type == "cuda" else "")
            print(f"yardstick {trainer + (' compiled' if row['compiled'] else ''):19s} {precision:7s} {row['device']:6s} {dataset['name']:7s} {per_round * 1000:9.1f} ms/round  "
                  f"{row['rounds_per_second']:7.2f} rounds/s  {row['client_steps_per_second']:8.0f} client-steps/s  "
                  f"{row['samples_per_second']:9.0f} samples/s  final evaluation {row['final_eval_seconds']:.1f} s  "
                  f"peak RSS {row['peak_rss_mib']:.0f} MiB{extra}", flush=True)
    return rows


def run_bench(workloads: list[str] | None = None, rounds: int | None = None, output: str | None = None,
              repeats: int = 3, parts: list[str] | None = None, device: str = "cpu",
              trainers: list[str] | None = None, users: int = YARDSTICK["users"],
              data_dir: str = "resources/datasets", precisions: list[str] | None = None,
              compiled: bool = False, populations: list[int] | None = None, methods: list[str] | None = None,
              plot_to: str | None = None, limit_s: float = 600, limit_mib: float = 8192,
              rows_to: str | None = None, client_store: str = "memory") -> dict:
    # The yardstick trains minutes per run on a CPU: it runs only when asked for.
    parts = parts or ["overhead", "trainers", "steps", "eval", "apply"]
    figures: dict = {"torch_threads": torch.get_num_threads(), "torch": torch.__version__}
    scale_rounds, rounds = rounds or 4, rounds or 10
    if torch.device(device).type == "cuda":
        figures["gpu"] = torch.cuda.get_device_name()
    if "overhead" in parts:
        figures["results"] = bench_overhead(workloads, rounds, repeats)
    if "trainers" in parts:
        figures["trainers"] = bench_trainers(repeats=repeats, device=device)
    if "steps" in parts:
        figures["steps"] = bench_steps(repeats=repeats, device=device)
    if "eval" in parts:
        figures["eval"] = bench_eval(repeats=repeats)
    if "apply" in parts:
        figures["apply"] = bench_apply(repeats=repeats, device=device)
    if "scale" in parts:
        from cflpipe.bench_scale import POPULATIONS, bench_methods_at_scale

        figures["scale_methods"] = bench_methods_at_scale(populations or POPULATIONS, methods, scale_rounds, device,
                                                          output=rows_to, plot_to=plot_to, limit_s=limit_s,
                                                          limit_mib=limit_mib, client_store=client_store)
        # Full against sampled evaluation only where sampling saves anything (1,000 clients and
        # more) and a full evaluation is still affordable (at 100,000 it took 5.5 GB and was
        # stopped after 10 minutes: the cost the default's sample exists to avoid), of the
        # populations and methods asked for.
        asked = populations or (1000, 10000)
        large = tuple(p for p in asked if 10 * SCALE_SAMPLE <= p <= FULL_EVAL_MAX)
        pair = [m for m in SCALE_METHODS if not methods or m in methods]
        beyond = [p for p in asked if p > FULL_EVAL_MAX]
        if large and pair:
            figures["scale"] = bench_scale(large, repeats=repeats, device=device, methods=pair)
        elif not (beyond and pair):
            print(f"scale     full against sampled evaluation: not run (it needs --clients of "
                  f"{10 * SCALE_SAMPLE:,} to {FULL_EVAL_MAX:,} and --method {' or '.join(SCALE_METHODS)})", flush=True)
        if beyond and pair:
            print(f"scale     full against sampled evaluation: not run at {', '.join(f'{p:,}' for p in beyond)} "
                  f"clients (every client's evaluation past {FULL_EVAL_MAX:,} is what the sample avoids)", flush=True)
    if "yardstick" in parts:
        figures["yardstick"] = bench_yardstick(rounds, device, trainers or ["sequential", "batched"], users, data_dir,
                                               precisions or ["float32"], compiled)
    if output:
        from cflpipe.store import write_text

        write_text(output, json.dumps(figures, indent=2))
    return figures


def bench_overhead(workloads: list[str] | None, rounds: int, repeats: int) -> list[dict]:
    rows = []
    for name in workloads or list(WORKLOADS):
        for clients in WORKLOADS[name]["clients"]:
            row = bench_workload(name, clients, rounds, repeats)
            rows.append(row)
            print(f"{name:9s} clients={clients:5d}  engine {row['engine_seconds_per_round'] * 1000:8.1f} ms/round  "
                  f"tight loop {row['tight_loop_seconds_per_round'] * 1000:8.1f} ms/round  "
                  f"overhead ×{row['overhead_ratio']:.3f}  peak RSS {row['peak_rss_mib']:.0f} MiB", flush=True)
    return rows
