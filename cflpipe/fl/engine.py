"""The round loop: seeded client sampling, the method hooks, batched evaluation, communication
accounting, timing, checkpoints and the run's output files. No method-specific code lives here."""

from __future__ import annotations

import math
import os
import sys
import time
from collections import defaultdict
from typing import Any

import numpy as np
import pandas as pd
import torch

from cflpipe.errors import DivergenceError, SpecError
from cflpipe.fl.data import FederatedData
from cflpipe.fl.heartbeat import Heartbeat
from cflpipe.fl.axes import AXIS_TABLES, axes_of
from cflpipe.fl.evaluation import evaluate, evaluated_population, train_split_clients
from cflpipe.fl.method import (Context, Method, Payload, Update, WeightedSum, divergence_error, client_update,
                               client_work, receive, streams_means)
from cflpipe.fl.plan import Results
from cflpipe.fl.params import ParamSpace
from cflpipe.fl.outputs import STANDARD_TABLES, write_outputs
from cflpipe.fl.resume import discard_state, save_state, try_resume
from cflpipe.fl.sampling import sample, training_clients
from cflpipe.fl.trainer_choice import build_trainer
from cflpipe.fl.runs import (LOCK_FILE, OUTPUT_FILES, ResolvedRun, RunResult, read_json, remove_empty, resolve_device, resolve_run,
                             same_run, state_folders, store_folder)
from cflpipe.registry import method_info
from cflpipe.models import build_model
from cflpipe.seeds import rng
from cflpipe.spec import Spec, Training
from cflpipe import store

# Whether this process has trained a round yet: its first pays one-time costs (allocations, first
# kernels, lazy imports), which made a job's first run (FedAvg in most specs) look slowest.
_process_warm = False
# Whether this process has evaluated yet: its first evaluation pays its own (the scoring's imports
# and kernels: 1.5 s against 0.2 ms on the default's digits), which put a job's first run's
# evaluation round in its per-round time (FedAvg 0.14 s a round against 0.07 in the same job).
_process_evaluated = False
PER_RUN_WARMUP_TRAINERS = ("processes", "distributed")
# A run with more than this share of its sampled clients' updates skipped as diverged fails.
MAX_SKIPPED_SHARE = 0.5
# A round's mean training loss this many times the first round's prints a warning.
EXPLODING_FACTOR = 10.0



def train_run(spec: Spec, scenario: str, method: str, seed: int, force: bool = False,
              progress: bool = True) -> RunResult:
    return train_resolved(resolve_run(spec, scenario, method, seed, threads=torch.get_num_threads()), force, progress)


def is_finished(resolved: ResolvedRun) -> bool:
    """The run's folder holds it finished, with this configuration: training it again is skipped."""
    run_dir = resolved.run_dir
    return (run_dir / "summary.json").exists() and (run_dir / "config.yaml").exists() \
        and same_run(run_dir / "config.yaml", resolved.config) and all((run_dir / f).exists() for f in OUTPUT_FILES)


def train_resolved(resolved: ResolvedRun, force: bool = False, progress: bool = True) -> RunResult:
    """Train a resolved run (skipped when its folder holds it finished, resumed when killed)."""
    run_dir = resolved.run_dir
    existed = next(p for p in (run_dir, *run_dir.parents) if p.exists())
    try:  # before any training: a results_dir that cannot hold the run fails now, not at the first checkpoint
        run_dir.mkdir(parents=True, exist_ok=True)
        if not os.access(run_dir, os.W_OK):
            raise PermissionError(13, "not writable")
    except OSError as exc:
        raise SpecError(f"results_dir: cannot write the run folder {run_dir} ({exc.strerror})") from None
    summary_path = run_dir / "summary.json"
    # One writer per run: a second `cflpipe train` of the same run would interleave its files.
    # It is refused before this block, so it never cleans up after the one that holds the lock.
    with store.exclusive(run_dir / LOCK_FILE, f"run {resolved.scenario}/{resolved.method}/seed{resolved.seed} "
                                              f"({run_dir})"):
        try:
            if not force and is_finished(resolved):
                return RunResult(run_dir, True, read_json(summary_path))
            store.sweep_temp_files(run_dir, *state_folders(run_dir))  # left by a killed writer
            return Run(resolved).execute(resume=not force, progress=progress)
        except BaseException:
            if existed != run_dir:  # a run that failed before writing anything leaves no folders behind
                remove_empty(run_dir, existed)
            raise


def prepare_run(spec: Spec, scenario: str, method: str, seed: int) -> "Run":
    """A run with its data, model and method built but no round played (tests, benchmarks)."""
    run = Run(resolve_run(spec, scenario, method, seed, threads=torch.get_num_threads()))
    run.setup()
    return run


class Run:
    """One run's rounds, evaluations, checkpoints and outputs, from its ResolvedRun alone."""

    def __init__(self, resolved: ResolvedRun):
        self.resolved = resolved
        self.live = None  # workflow.live's writer (fl/live.py) while the run trains
        self.scenario, self.method_name, self.seed = resolved.scenario, resolved.method, resolved.seed
        self.config, self.config_text, self.run_dir = resolved.config, resolved.config_text, resolved.run_dir
        self.training: Training = resolved.training
        self.device = resolve_device(self.training.device)
        self.state_path = resolved.state_path

    # ------------------------------------------------------------------ setup

    def setup(self) -> None:
        if self.device.type == "cuda":
            # CPU kernels are deterministic already; the switch costs over a second per process
            # (it loads torch's compiler stack), so it is paid only where it matters.
            torch.use_deterministic_algorithms(True, warn_only=True)
        self.data: FederatedData = self.resolved.load_data(self.device)
        # The scenario's evaluation axes (fl/axes): new clients are held out of everything that
        # trains here, before the method's context exists.
        self.axes = axes_of(self)
        for axis in self.axes:
            axis.prepare(self)
        self.every_client_rounds = frozenset().union(*(axis.every_client_rounds for axis in self.axes))
        torch.manual_seed(self.seed)
        model = build_model(self.training.model, self.data.input_shape, self.data.num_classes,
                            field_path="training.model")
        self.space = ParamSpace(model, self.device)
        info = method_info(self.resolved.method_type)
        hp = self.resolved.hyperparams
        # A method whose plans cannot be batched trains them one by one; a plugin's trainer
        # (which runs plans elsewhere) is its own business.
        name = self.training.trainer
        batches = name in ("auto", "batched")
        self.trainer = build_trainer(name if info.capabilities.batchable or not batches else "sequential",
                                     self.device, self.training.model, workers=self.training.workers,
                                     compiled=self.training.compile, recorded=self.resolved.trainer_choices)
        self.ctx = Context(self.data, self.space, self.training, hp, self.seed, self.space.read(),
                           self.scenario, self.method_name, self.trainer)
        self.training_clients = training_clients(self.data, self.training, info.capabilities, self.method_name,
                                                 self.scenario, self.resolved.key_path("clients_per_round"))
        # the clients a full evaluation reads (training.full_eval_clients; None: every client)
        self.population = evaluated_population(self.data, self.training, self.seed)
        self.ctx.population = self.population
        if self.training.client_store == "disk":
            self.ctx.clients.on_disk(store_folder(self.run_dir))
        self.train_split_clients = train_split_clients(self.data, self.training, self.seed, self.training_clients,
                                                       self.population)
        self.method: Method = info.cls(self.ctx)
        for axis in self.axes:
            axis.attach(self)
        self.trainer.took_measurement()  # what a method's setup trained is no round's warm-up
        self.tables: dict[str, dict[str, list]] = {n: defaultdict(list) for n in STANDARD_TABLES}
        self._warned_exploding = False
        self.start_round = 0

    def sample(self, round_index: int) -> np.ndarray:
        away = [gone for axis in self.axes if (gone := axis.away(round_index + 1)) is not None]
        return sample(self.seed, round_index, self.training.clients_per_round, self.data.num_clients,
                      self.training_clients, away)

    # ------------------------------------------------------------------ loop

    def execute(self, resume: bool, progress: bool) -> RunResult:
        try:
            return self._execute(resume, progress)
        finally:
            if hasattr(self, "trainer"):
                self.trainer.close()
            if hasattr(self, "ctx"):  # the client store's files: a resume reads the checkpoint
                self.ctx.clients.remove_files()
            if self.live is not None:  # a failed run's curves too
                self.live.close()

    def _execute(self, resume: bool, progress: bool) -> RunResult:
        self.setup()
        if resume:
            self.try_resume()
            # the axes as of the rounds already trained (drift's moves), also where none is left
            # to play (a resume from the last checkpoint writes the outputs with the truth as it ended)
            for axis in self.axes:
                axis.at_round(self.start_round)
        else:  # --force trains afresh: nothing of an earlier checkpoint may serve as its fallback
            self.discard_state()
        rounds = self.training.rounds
        from tqdm import tqdm

        bar = tqdm(total=rounds, initial=self.start_round, disable=None if progress else True,
                   desc=f"{self.scenario}/{self.method_name}/seed{self.seed}", unit="round", leave=False)
        if self.resolved.live_dir is not None:
            from cflpipe.fl.live import LiveCurves

            self.live = LiveCurves(self.resolved.live_dir, self.start_round)  # closed by execute
        # tqdm draws nothing where stderr is no terminal (a redirected `cflpipe train`): the beat speaks there too
        with Heartbeat(str(self.run_dir), rounds, enabled=bool(bar.disable)) as beat:
            self._rounds(rounds, bar, beat)
            bar.close()
            self.check_trained()
            beat.at(rounds, "writing its outputs")
            summary = self.write_outputs()
        return RunResult(self.run_dir, False, summary)

    def _rounds(self, rounds: int, bar: Any, beat: Heartbeat) -> None:
        for r in range(self.start_round, rounds):
            beat.at(r + 1, "training")
            for axis in self.axes:  # drift's moves up to this round (after a resume, all before it)
                axis.at_round(r + 1)
            self.ctx.round = r
            self.ctx.extra_bytes_down = self.ctx.extra_bytes_up = 0
            t0 = time.perf_counter()
            sampled = self.sample(r)
            self.method.round_start(sampled)
            clients = [int(c) for c in sampled]
            payloads = {c: self.method.payload(c) for c in clients}
            bytes_down = sum(p.nbytes for p in payloads.values())
            # Every sampled client's local work as plans, executed together by the trainer.
            # Only the updates hold the trained vectors from here on, so aggregation can free
            # each upload as it copies it (see stack_updates); a method that reads only weighted
            # means gets them summed as clients finish, holding no upload at all.
            if streams_means(type(self.method)):
                means, bytes_up, losses, skipped = self.train_summed(r, payloads)
                t1 = time.perf_counter()
                beat.at(r + 1, "server")
                if means is not None:
                    self.method.aggregate_means(means)
            else:
                updates, bytes_up, losses, skipped = self.collect_updates(
                    r, payloads, *self.train_clients(payloads))
                t1 = time.perf_counter()
                beat.at(r + 1, "server")
                receive(self.method, updates)
                # Nor is a round's traffic kept while the next round trains (2× the uploads at
                # full participation, #17).
                del updates
            t2 = time.perf_counter()
            del payloads
            row: dict[str, Any] = {"round": r + 1, "sampled": len(sampled), "skipped": skipped,
                                   "train_loss": float(np.mean(losses)) if losses else float("nan"),
                                   "bytes_down": bytes_down + self.ctx.extra_bytes_down,
                                   "bytes_up": bytes_up + self.ctx.extra_bytes_up}
            row.update(self.method.round_metrics())
            self.warn_if_exploding(row["train_loss"])
            for axis in self.axes:
                axis.after_round(self, r + 1)
            evaluated = self.training.is_evaluated(r + 1) or r + 1 in self.every_client_rounds
            if evaluated:
                beat.at(r + 1, "evaluating")
                row.update(self.evaluate(r + 1))
                bar.set_postfix(acc=f"{row.get('acc_macro', row.get('val_acc_macro', math.nan)):.3f}",
                                clusters=row["n_clusters"])
                if self.live is not None:
                    self.live.log(r + 1, row)
            t3 = time.perf_counter()
            self.ctx.clients.release()  # the client store on disk keeps no round's pages resident
            self.data.release_pages()  # nor the inputs it holds
            self.append("rounds", row)
            global _process_warm, _process_evaluated
            # A trainer with workers of its own starts them, or sends them the networks, in each
            # run's first round: that round is a warm-up whatever ran before in the process.
            # A round in which auto timed both trainers trained twice: a warm-up as well, as is
            # the round of the process's first evaluation.
            measured = self.trainer.took_measurement()
            warmup = measured or not _process_warm or (r == self.start_round and self.trainer.name in PER_RUN_WARMUP_TRAINERS) \
                or (evaluated and not _process_evaluated)
            _process_evaluated = _process_evaluated or evaluated
            self.append("timing", {"round": r + 1, "seconds": t3 - t0, "train_seconds": t1 - t0,
                                   "server_seconds": t2 - t1, "eval_seconds": t3 - t2, "warmup": warmup})
            _process_warm = True
            bar.update(1)
            if (r + 1) % self.training.checkpoint_every == 0 or r + 1 == rounds:
                beat.at(r + 1, "saving its checkpoint")
                self.save_state(r + 1)

    def train_clients(self, payloads: dict[int, Payload]) -> tuple[dict[int, Results], dict[int, Any]]:
        """Every sampled client's plans, trained together by the trainer, and their scratch."""
        started = {c: client_work(self.method, c, payload) for c, payload in payloads.items()}
        return self.ctx.run({c: plans for c, (plans, _) in started.items()}), {c: s for c, (_, s) in started.items()}

    def collect_updates(self, r: int, payloads: dict[int, Payload], trained: dict[int, Results], scratch: dict[int, Any]
                   ) -> tuple[dict[int, Update], int, list[float], int]:
        """The sampled clients' updates (diverged ones skipped or stopping the run), the bytes
        they send and their losses."""
        updates, bytes_up, losses, skipped = {}, 0, [], 0
        for client, payload in payloads.items():
            update = client_update(self.method, client, payload, trained.pop(client), scratch.pop(client))
            if not self.accepted(r, client, update):
                skipped += 1
                continue
            bytes_up += update.nbytes
            losses.append(update.result.loss)
            updates[client] = update
        return updates, bytes_up, losses, skipped

    def train_summed(self, r: int, payloads: dict[int, Payload]
                     ) -> tuple[dict[str, torch.Tensor] | None, int, list[float], int]:
        """collect_updates and receive for a method with streamed_means: each accepted update's kept
        tensors stored and its means' vectors added to running sums as its client finishes, in
        the clients' order (average_updates' order, so the bits are those of receive). Returns
        the means (None if no update was accepted), bytes up, losses and the skipped count."""
        started = {c: client_work(self.method, c, payload) for c, payload in payloads.items()}
        sums = {key: WeightedSum() for key in type(self.method).streamed_means}
        bytes_up, losses, skipped = 0, [], 0
        for client, trained in self.ctx.run_each({c: plans for c, (plans, _) in started.items()}):
            _, scratch = started.pop(client)
            update = client_update(self.method, client, payloads[client], trained, scratch)
            del trained, scratch
            if self.accepted(r, client, update):
                bytes_up += update.nbytes
                losses.append(update.result.loss)
                for name, tensor in update.keep.items():
                    self.ctx.clients.set(name, client, tensor)
                for key, total in sums.items():
                    total.add(update.tensors[key], update.n)
            else:
                skipped += 1
            del update  # not held while the next client trains
        if not losses:
            return None, bytes_up, losses, skipped
        return {key: total.mean() for key, total in sums.items()}, bytes_up, losses, skipped

    def accepted(self, r: int, client: int, update: Update) -> bool:
        """False for a diverged update under on_divergence: skip; the run stops under stop."""
        if not update.result.diverged:
            return True
        if self.training.on_divergence == "stop":
            raise divergence_error(r, client, self.method_name, update.result.loss)
        return False

    def check_trained(self) -> None:
        """With on_divergence: skip, a run whose updates were mostly skipped has not trained; its
        figures would be the initial model's. Fail before any output is written."""
        rounds = self.tables["rounds"]
        sampled, skipped = sum(rounds["sampled"]), sum(rounds["skipped"])
        if sampled and skipped > MAX_SKIPPED_SHARE * sampled:
            raise DivergenceError(f"{self.scenario}/{self.method_name}/seed{self.seed}: {skipped} of {sampled} "
                                  f"client updates diverged and were skipped (training.on_divergence: skip), so "
                                  f"the run did not train; lower training.lr")

    def warn_if_exploding(self, loss: float) -> None:
        """Warn once when the mean training loss grows far beyond the first round's (finite, but
        on its way to diverging)."""
        rounds = self.tables["rounds"]
        first = next(((r, v) for r, v in zip(rounds["round"], rounds["train_loss"])
                      if v is not None and math.isfinite(v)), None)
        if self._warned_exploding or first is None or not math.isfinite(loss) or loss <= EXPLODING_FACTOR * first[1]:
            return
        self._warned_exploding = True
        print(f"warning: {self.scenario}/{self.method_name}/seed{self.seed}: round {self.ctx.round + 1} training "
              f"loss {loss:.4g} is over {EXPLODING_FACTOR:g}× round {first[0]}'s ({first[1]:.4g}); training may "
              f"be diverging (lower training.lr)", file=sys.stderr)

    def append(self, table: str, row: dict[str, Any]) -> None:
        columns = self.tables[table]
        length = len(next(iter(columns.values()))) if columns else 0
        for key in row:
            if key not in columns:  # a figure that appears late (e.g. after warm-up)
                columns[key] = [None] * length
        for key in columns.keys():
            columns[key].append(row.get(key))

    def extend(self, table: str, columns: dict[str, np.ndarray]) -> None:
        for key, values in columns.items():
            self.tables[table][key].extend(np.asarray(values).tolist())

    # ------------------------------------------------------------------ evaluation

    @property
    def population_size(self) -> int:
        """How many clients a full evaluation reads."""
        return self.data.num_clients if self.population is None else len(self.population)

    def full_evaluations(self, evals: pd.DataFrame) -> pd.DataFrame:
        if "evaluated_clients" not in evals.columns:
            return evals
        # (an axis's round reads every client: more than a population sample)
        return evals[evals["evaluated_clients"] >= self.population_size]

    def evaluation_sample(self, round_number: int) -> np.ndarray | None:
        """The clients an evaluation reads (sorted), or None: all. A full one reads the run's
        population (training.full_eval_clients), a round an axis needs (drift's) every client, the
        others a sample seeded by run and round (training.eval_clients)."""
        m, wanted = self.data.num_clients, self.training.eval_clients
        if round_number in self.every_client_rounds:
            return None
        if self.training.is_full_evaluation(round_number) or wanted >= self.population_size:
            return self.population
        # from the population: a sampled round estimates what full evaluations read
        return np.sort(rng(self.seed, round_number, 0x62).choice(m if self.population is None else self.population,
                                                                 wanted, replace=False))

    def served_accuracy(self, clients: np.ndarray, round_number: int) -> np.ndarray:
        """Each of `clients`' (sorted ids) accuracy on its own test split with what the method
        serves it now: an axis's reading, written to no table of the run's."""
        metrics = evaluate(self.ctx, self.method, self.data, self.training.eval_batch_size, self.seed, round_number,
                           clients, train_split=False).tables["metrics"]
        test = metrics["split"] == "test"
        acc = dict(zip(np.asarray(metrics["client"])[test].tolist(), np.asarray(metrics["acc"])[test]))
        return np.array([acc.get(int(c), np.nan) for c in clients], dtype=float)

    def evaluate(self, round_number: int) -> dict[str, Any]:
        clients = self.evaluation_sample(round_number)
        result = evaluate(self.ctx, self.method, self.data, self.training.eval_batch_size, self.seed, round_number,
                          clients, self.training.eval_train is not False, self.train_split_clients,
                          self.training.eval_test)
        if self.training.eval_clients is not None or self.population is not None:  # what each round read
            result.figures["evaluated_clients"] = self.data.num_clients if clients is None else len(clients)
        if self.training.eval_train == "auto":  # how many training splits it read
            evaluated = np.arange(self.data.num_clients) if clients is None else clients
            read = evaluated if self.train_split_clients is None else np.intersect1d(evaluated, self.train_split_clients)
            result.figures["train_evaluated_clients"] = int((self.data.train.sizes()[read] > 0).sum())
        for axis in self.axes:
            if (found := axis.evaluate(self, round_number, clients, result)) is not None:
                figures, table = found
                result.figures.update(figures)
                if table:
                    self.tables.setdefault(axis.name, defaultdict(list))
                    self.extend(axis.name, table)
        for name, columns in result.tables.items():
            self.extend(name, columns)
        for name, columns in result.method_tables.items():
            if name in STANDARD_TABLES or name in AXIS_TABLES:
                raise RuntimeError(f"{self.method_name}: eval table {name!r} clashes with a standard output")
            self.tables.setdefault(name, defaultdict(list))
            self.extend(name, columns)
        return result.figures

    # ------------------------------------------------------------------ state and outputs (fl/resume.py,
    # fl/outputs.py; methods here so that a test can stop a run at either)

    def save_state(self, round_number: int) -> None:
        save_state(self, round_number)

    def discard_state(self) -> None:
        discard_state(self)

    def try_resume(self) -> None:
        try_resume(self)

    def write_outputs(self) -> dict[str, Any]:
        return write_outputs(self)
