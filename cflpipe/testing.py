"""The conformance checks every method must pass, importable by plugin authors (after
scikit-learn's `check_estimator` / `parametrize_with_checks`). In a plugin's tests:

    from cflpipe.testing import parametrize_with_checks

    @parametrize_with_checks(["fedavgm"])          # registered names; None: every method
    def test_conformance(method, check, tmp_path):
        check(method, tmp_path)

or `check_method("fedavgm", tmp_path)` to run them all in one call. Each check trains the method
on a tiny scenario (6 digits clients in 2 label-swap groups, 3 of them per round, 4 rounds of an
MLP: seconds) and raises AssertionError with what went wrong:

- check_resume: interrupted right after a checkpoint, the run resumes to byte-identical outputs
- check_outputs_from_last_checkpoint: a run stopped after its last checkpoint (which holds no
  models) rebuilds its outputs from that checkpoint's tables
- check_determinism: the same spec and seed give identical bytes
- check_evaluation_does_not_change_training: evaluating every round or only every other one
  gives the same training losses and final figures
- check_clients_use_only_what_they_were_sent: the server's state is NaN while clients plan and
  finish, and while they answer its questions (Context.ask), so a client that read anything not
  counted as bytes down trains to NaN (traffic), and
  the server's state after the clients' work must equal the state before it, so a client that
  wrote to it (through a payload tensor that is a view of the server's) fails
- check_state_round_trip: the method's checkpoint and client store round-trip through the
  engine's checkpoint into a fresh method that evaluates identically
- check_sampled_predictor: what a sampled evaluation's clients predict with (`predictor(clients)`,
  the default at scale: training.full_eval_clients) is what they predict with in a full one
- check_k_rule: a number of clusters above the clients is refused in one line (methods with K)
- check_batched_equals_sequential: the batched trainer trains what the sequential one trains
  (batchable methods)
- check_new_clients_change_no_training: with new clients (scenario new_clients), placing them
  changes no state of the method and no byte the participants train
- check_changing_clients_resume: with groups that change (scenario drift, two clients moved in
  round 3) and clients away (scenario availability, two clients in rounds 2–3), a run interrupted
  after any round's checkpoint (before the move, after it, after the last round) resumes to
  byte-identical outputs

A method makes its mechanism act within those few rounds by returning hyper-parameters from
`Method.check_hyperparams(params)` (cluster from round 1, split early; e.g. CFL's warm-up of 1).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd
import torch

from cflpipe.errors import SpecError
from cflpipe.fl import checkpoint, engine
from cflpipe.fl.checkpoint import read_state, write_state
from cflpipe.fl.engine import OUTPUT_FILES, prepare_run, train_run
from cflpipe.fl.trainer_choice import CHOICES_ENV
from cflpipe.fl.method import client_update, client_work, receive, streams_means
from cflpipe.registry import all_methods, method_info
from cflpipe.spec import parse_spec

ROUNDS = 4
# config.yaml names the run's own directories; timing.* holds wall-clock times.
COMPARED = [f for f in OUTPUT_FILES if not f.startswith("timing") and f != "config.yaml"]


# ---------------------------------------------------------------------------- the tiny run


def hyperparams(name: str) -> dict[str, Any]:
    """The method's hyper-parameters for the checks (its `check_hyperparams`)."""
    info = method_info(name)
    return dict(info.cls.check_hyperparams(info.params))


def spec_dict(results: Path, name: str, **training: Any) -> dict[str, Any]:
    """The checks' spec: one scenario `s`, one seed, the method under its registered name."""
    info = method_info(name)
    public = {"pool": "train", "public": {"size": 40}} if info.capabilities.needs_public else {}
    return {
        "seeds": [0],
        "training": {"model": "mlp", "rounds": ROUNDS, "clients_per_round": 3, "local_steps": 2, "batch_size": 8,
                     "lr": 0.05, "momentum": 0.5, "eval_every": 2, "checkpoint_every": 1, "device": "cpu",
                     **training},
        "scenarios": {"s": {"dataset": "digits", "clients": 6, **public,
                            "partition": [{"kind": "iid"}, {"kind": "label_swap", "groups": 2}]}},
        "methods": {name: hyperparams(name)},
        "results_dir": str(results),
        "data_dir": str(results.parent / "data"),
    }


def finished(results: Path, name: str, **training: Any) -> Path:
    """A whole run of the checks' spec; its folder."""
    spec = parse_spec(spec_dict(results, name, **training))
    train_run(spec, "s", name, 0, force=True, progress=False)
    return spec.run_dir("s", name, 0)


_REFERENCES: dict[str, Path] = {}


def reference_run(name: str) -> Path:
    """One uninterrupted run per method and process, shared by the checks that compare with it."""
    if name not in _REFERENCES:
        _REFERENCES[name] = finished(Path(tempfile.mkdtemp(prefix="cflpipe-checks-")) / "reference", name)
    return _REFERENCES[name]


def same_bytes(a: Path, b: Path) -> None:
    """The standard outputs and a method's own tables (e.g. FCCA's similarity.parquet) are equal."""
    extra = sorted({p.name for p in a.glob("*.parquet")} - set(OUTPUT_FILES))
    assert extra == sorted({p.name for p in b.glob("*.parquet")} - set(OUTPUT_FILES)), "the method's own tables"
    for f in [*COMPARED, *extra]:
        assert (a / f).read_bytes() == (b / f).read_bytes(), f"{f} differs"


def play(run: Any, rounds: int, poison: bool = False) -> list[dict]:
    """Engine rounds without outputs, returning the method's round metrics; with `poison`, every
    server tensor the method checkpoints is NaN while the clients plan and finish, and while they
    answer the server's questions (Context.ask; restored after), and the checkpointed state must
    come out of the clients' work as it went in (the table the method names in `uploads_into`
    aside: the trainer writes uploads there)."""
    method, ctx = run.method, run.ctx
    if poison:
        ask = ctx.ask

        def poisoned_ask(payloads, **options):
            with _poisoned(method, f"a client asked in round {ctx.round + 1}"):
                answers = ask(payloads, **options)
            for c, answer in answers.items():
                _assert_finite(answer, f"client {c} asked in round {ctx.round + 1}", ctx.train_sizes()[c])
            return answers

        ctx.ask = poisoned_ask
    reported = []
    for r in range(rounds):
        ctx.round = r
        sampled = run.sample(r)
        method.round_start(sampled)
        payloads = {int(c): method.payload(int(c)) for c in sampled}
        with _poisoned(method, f"a client of round {r + 1}") if poison else contextlib.nullcontext():
            started = {c: client_work(method, c, payloads[c]) for c in payloads}
            trained = ctx.run({c: plans for c, (plans, _) in started.items()})
            updates = {c: client_update(method, c, payloads[c], trained[c], started[c][1]) for c in payloads}
        for c, update in updates.items():
            _assert_finite(update, f"client {c} of round {r + 1}", 1)
            assert not update.result.diverged, f"client {c} of round {r + 1} diverged"
        receive(method, updates)
        reported.append(method.round_metrics())
    return reported


@contextlib.contextmanager
def _poisoned(method: Any, who: str):
    """The method's checkpointed floating tensors NaN within the block, restored after it; the
    state after must equal the state before."""
    before = _server_state(method)
    saved = {}
    for attr in method.checkpoint:
        value = getattr(method, attr)
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            saved[attr] = value
            setattr(method, attr, torch.full_like(value, float("nan")))
    try:
        yield
    finally:
        for attr, value in saved.items():
            setattr(method, attr, value)
    try:
        _assert_state_equal(_server_state(method), before)
    except AssertionError:
        raise AssertionError(f"{who} wrote to the server's state (a payload tensor that is a view of it?); "
                             f"send copies, or name the table in uploads_into") from None


def _assert_finite(update: Any, who: str, samples: int) -> None:
    """What a client sent and kept is finite (a client without samples may send NaN: no loss)."""
    if not samples:
        return
    sent = [t for t in update.tensors.values() if t.is_floating_point()]
    assert all(torch.isfinite(t).all() for t in sent + list(update.keep.values())), \
        f"{who} used server state that was not in its payload"


def _server_state(method: Any) -> dict:
    """A copy of the method's checkpointed state (the uploads_into table left out) and of the
    networks' initial vectors the clients' views share."""
    state = {key: value for key, value in method.state_dict().items() if key != method.uploads_into}
    state.update({f"initial {name}": vector for name, vector in method.ctx.initial.items()})
    return {key: value.clone() if isinstance(value, torch.Tensor) else copy.deepcopy(value)
            for key, value in state.items()}


class _Killed(Exception):
    pass


def _patched(owner: Any, attribute: str, replacement: Any):
    """Replace an attribute for the duration of a with-block (what pytest's monkeypatch does,
    without needing pytest)."""
    class Patch:
        def __enter__(self):
            self.old = getattr(owner, attribute)
            setattr(owner, attribute, replacement)

        def __exit__(self, *exc):
            setattr(owner, attribute, self.old)
            return False

    return Patch()


# ---------------------------------------------------------------------------- the checks


def _killed_then_resumed(spec: Any, name: str, stop_after: int) -> Path:
    """The checks' run killed right after its checkpoint of round `stop_after`, then resumed to
    the end; its folder."""
    save = engine.Run.save_state

    def save_then_die(self, round_number):
        save(self, round_number)
        if round_number == stop_after:
            raise _Killed

    with _patched(engine.Run, "save_state", save_then_die):
        try:
            train_run(spec, "s", name, 0, progress=False)
        except _Killed:
            pass
        else:
            raise AssertionError("the interruption did not happen")
    assert not (spec.run_dir("s", name, 0) / "summary.json").exists()
    train_run(spec, "s", name, 0, progress=False)
    return spec.run_dir("s", name, 0)


@functools.cache
def _process_record() -> Path:
    """The record of trainer choices the checks of this process share."""
    return Path(tempfile.mkdtemp(prefix="cflpipe-checks-")) / "trainer-choices.json"


def _one_record(check: Callable[[str, Path], None]) -> Callable[[str, Path], None]:
    """The check with every results folder it makes sharing one record of trainer choices
    (CFLPIPE_TRAINER_CHOICES: the one named already, else one for the process, as the reference
    runs are cached for the process): it compares runs of two folders, and `trainer: auto`
    measuring apart in each could pick two trainers, whose bytes differ in the last bits."""
    @functools.wraps(check)
    def checked(name: str, workdir: Path) -> None:
        before = os.environ.get(CHOICES_ENV)
        os.environ[CHOICES_ENV] = before or str(_process_record())
        try:
            check(name, workdir)
        finally:
            if before is None:
                os.environ.pop(CHOICES_ENV, None)
            else:
                os.environ[CHOICES_ENV] = before
    return checked


@_one_record
def check_resume(name: str, workdir: Path) -> None:
    stop_after = int(np.random.default_rng(list(name.encode())).integers(1, ROUNDS))
    spec = parse_spec(spec_dict(Path(workdir), name))
    # Every table of two dimensions goes to row blocks (the reference kept them inside state.pt),
    # so the resumed state is what comes back through the checkpoint's blocks.
    with _patched(checkpoint, "MIN_ROWS_BYTES", 1):
        resumed = _killed_then_resumed(spec, name, stop_after)
    same_bytes(reference_run(name), resumed)


@_one_record
def check_outputs_from_last_checkpoint(name: str, workdir: Path) -> None:
    def die(self):
        raise _Killed

    spec = parse_spec(spec_dict(Path(workdir), name))
    with _patched(engine.Run, "write_outputs", die):
        try:
            train_run(spec, "s", name, 0, progress=False)
        except _Killed:
            pass
    run_dir = spec.run_dir("s", name, 0)
    assert read_state(run_dir / "state/state.pt")[0]["method"] is None, "the last checkpoint holds models"
    train_run(spec, "s", name, 0, progress=False)
    same_bytes(reference_run(name), run_dir)


@_one_record
def check_determinism(name: str, workdir: Path) -> None:
    same_bytes(reference_run(name), finished(Path(workdir), name))


@_one_record
def check_evaluation_does_not_change_training(name: str, workdir: Path) -> None:
    reference_dir = reference_run(name)
    every_round = finished(Path(workdir), name, eval_every=1)
    ours = pd.read_parquet(every_round / "rounds.parquet")
    reference = pd.read_parquet(reference_dir / "rounds.parquet")
    assert ours["train_loss"].tolist() == reference["train_loss"].tolist(), "training losses"
    last = reference.dropna(subset=["acc_macro"]).iloc[-1]
    assert ours.dropna(subset=["acc_macro"]).iloc[-1]["acc_macro"] == last["acc_macro"]
    ours_metrics = pd.read_parquet(every_round / "metrics.parquet")
    reference_metrics = pd.read_parquet(reference_dir / "metrics.parquet")
    pd.testing.assert_frame_equal(ours_metrics[ours_metrics["round"] == ROUNDS].reset_index(drop=True),
                                  reference_metrics[reference_metrics["round"] == ROUNDS].reset_index(drop=True))
    assert json.loads((every_round / "summary.json").read_text())["final"] == \
        json.loads((reference_dir / "summary.json").read_text())["final"]


def check_clients_use_only_what_they_were_sent(name: str, workdir: Path) -> None:
    play(prepare_run(parse_spec(spec_dict(Path(workdir), name)), "s", name, 0), 3, poison=True)


def _assert_state_equal(a: Any, b: Any) -> None:
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape
        # NaN marks "not known yet" in some server tables (FCCA's similarity of unheard clients)
        assert torch.equal(a.cpu(), b.cpu()) or (a.is_floating_point() and torch.allclose(
            a.cpu(), b.cpu(), rtol=0, atol=0, equal_nan=True))
    elif isinstance(a, dict):
        assert set(a) == set(b)
        for key in a:
            _assert_state_equal(a[key], b[key])
    else:
        assert a == b or (a != a and b != b)


def check_state_round_trip(name: str, workdir: Path) -> None:
    spec = parse_spec(spec_dict(Path(workdir), name))
    run = prepare_run(spec, "s", name, 0)
    play(run, 3)
    path = Path(workdir) / "state.pt"
    # Every table of two dimensions goes to row blocks, two rows per block where rows are small.
    with _patched(checkpoint, "MIN_ROWS_BYTES", 1), _patched(checkpoint, "BLOCK_BYTES", 2 * 4 * 1024):
        write_state(path, {"method": run.method.state_dict(), "clients": run.ctx.clients.state_dict()})
        state, problem = read_state(path)
    assert problem is None, problem
    fresh = prepare_run(spec, "s", name, 0)
    fresh.method.load_state_dict(state["method"])
    fresh.ctx.clients.load_state_dict(state["clients"])
    fresh.ctx.round = run.ctx.round  # as the engine sets it before every round and evaluation
    _assert_state_equal(run.method.state_dict(), fresh.method.state_dict())
    _assert_state_equal(run.ctx.clients.state_dict(), fresh.ctx.clients.state_dict())
    a, b = run.method.predictor(), fresh.method.predictor()
    assert np.array_equal(a.index, b.index) and all(torch.equal(u, v) for u, v in zip(a.models, b.models))


def check_k_rule(name: str, workdir: Path) -> None:
    k_param = method_info(name).capabilities.k_param
    if not k_param:
        return
    raw = spec_dict(Path(workdir), name)
    raw["methods"][name][k_param] = 7
    try:
        parse_spec(raw)
    except SpecError as error:
        assert str(error) == f"methods.{name}.{k_param}: must be <= clients of scenario s (6), got 7", str(error)
    else:
        raise AssertionError(f"{k_param} = 7 with 6 clients was accepted")


def trained_alike(name: str, workdir: Path, trainer: str, tolerances: dict[str, float] | None = None) -> None:
    """`trainer` trains what the sequential trainer trains: evaluated models, assignment and the
    client store, to 1e-5 of their scale (`tolerances`: client-store tables compared by relative norm, Adam's)."""
    models = {}
    for which in ("sequential", trainer):
        run = prepare_run(parse_spec(spec_dict(Path(workdir) / which.replace(":", "-"), name, trainer=which)),
                          "s", name, 0)
        play(run, 3)
        predictor = run.method.predictor()
        models[which] = (torch.stack(predictor.models), predictor.index, run.method.assignment(), run.ctx.clients.state_dict())
        if which == "batched":
            assert run.trainer.counts["batched"] > 0, "the batched trainer batched nothing"
    (a, ia, ca, sa), (b, ib, cb, sb) = models["sequential"], models[trainer]
    assert np.array_equal(ia, ib)
    assert (ca is None) == (cb is None) and (ca is None or np.array_equal(ca, cb))
    assert float((a - b).abs().max()) <= 1e-5 * float(a.abs().max())
    assert set(sa) == set(sb)
    for table in sa:
        if table in (tolerances or {}):
            # Adam's tables: the difference as a whole, relative to the table's norm
            gap = float((sa[table] - sb[table]).norm() / max(float(sa[table].norm()), 1e-12))
            assert gap <= tolerances[table], f"{table}: relative difference {gap:.2e} > {tolerances[table]}"
            continue
        scale = max(float(sa[table].abs().max()), 1e-12)
        assert float((sa[table] - sb[table]).abs().max()) <= 1e-5 * scale, table


# Client state trained with Adam (FCCA's cINN): Adam divides each entry's step by the running RMS
# of its gradient, so where an entry's gradients nearly cancel over the steps, last-bit differences
# between the two trainers' sums grow without bound entry by entry (FCCA+Prox, 3 rounds: one
# entry in 13 000 off by 4e-3 of the table's largest entry). The table as a whole stays put: its
# relative difference was 4e-5, against 0.13 for the three rounds' own movement, which is what a
# wrong batch or client would be off by. So Adam's tables are compared by relative norm.
ADAM_TOLERANCE = {"flow": 1e-3}


def check_batched_equals_sequential(name: str, workdir: Path) -> None:
    if method_info(name).capabilities.batchable:
        trained_alike(name, workdir, "batched", ADAM_TOLERANCE)


@_one_record
def check_streamed_means_equal_held_updates(name: str, workdir: Path) -> None:
    """A method whose means the engine sums as clients finish (Method.streamed_means) gives the
    bytes it gives when the round's updates are held and passed to aggregate."""
    if not streams_means(method_info(name).cls):
        return
    spec = parse_spec(spec_dict(Path(workdir), name))
    with _patched(engine, "streams_means", lambda cls: False):  # the engine holds the updates
        train_run(spec, "s", name, 0, progress=False)
    same_bytes(reference_run(name), spec.run_dir("s", name, 0))


@_one_record
def check_new_clients_change_no_training(name: str, workdir: Path) -> None:
    """With new clients (scenario new_clients), placing them at each full evaluation changes no
    state of the method and no byte of what the participants train: the run's outputs equal
    those of the same run whose placements are skipped, new-client figures aside."""
    raw = spec_dict(Path(workdir) / "placed", name)
    raw["scenarios"]["s"]["new_clients"] = 0.34  # 2 of 6
    spec = parse_spec(raw)
    from cflpipe.fl.axes import newcomers as axis

    place = axis.place
    placed = []

    def checked(method, newcomers, *args):
        before = _server_state(method), {k: v.clone() for k, v in method.ctx.clients.state_dict().items()}
        ask = newcomers.ask

        def poisoned_ask(payloads, **options):  # new clients, too, use only what they are sent
            with _poisoned(method, f"a new client asked in round {newcomers.round + 1}"):
                answers = ask(payloads, **options)
            for c, answer in answers.items():
                _assert_finite(answer, f"new client {c} asked in round {newcomers.round + 1}",
                               newcomers.train_sizes()[c])
            return answers

        newcomers.ask = poisoned_ask
        try:
            out = place(method, newcomers, *args)
        finally:
            del newcomers.ask
        placed.append(bool(out[1]))
        try:
            _assert_state_equal(_server_state(method), before[0])
            _assert_state_equal(method.ctx.clients.state_dict(), before[1])
        except AssertionError:
            raise AssertionError("placing new clients changed the method's state") from None
        return out

    with _patched(axis, "place", checked):
        train_run(spec, "s", name, 0, progress=False)
    raw["results_dir"] = str(Path(workdir) / "skipped")
    skipped = parse_spec(raw)
    with _patched(axis, "place", lambda *args: ({}, {})):
        train_run(skipped, "s", name, 0, progress=False)
    a, b = spec.run_dir("s", name, 0), skipped.run_dir("s", name, 0)
    assert placed and (all(placed) or not any(placed)), "placed at every full evaluation, or never (no rule)"
    for f in ("metrics.parquet", "clusters.parquet", "plots.csv"):
        assert (a / f).read_bytes() == (b / f).read_bytes(), f"{f} differs when new clients are placed"
    ours, theirs = pd.read_parquet(a / "rounds.parquet"), pd.read_parquet(b / "rounds.parquet")
    pd.testing.assert_frame_equal(ours[[c for c in ours if not c.startswith("new_")]], theirs)


@_one_record
def check_changing_clients_resume(name: str, workdir: Path) -> None:
    """With scenario drift (two of the six clients move to the other group in round 3) and
    availability (two clients away in rounds 2–3), a run killed after the checkpoint of round 2
    (the move still to come, the clients away), of round 3 (the move to be applied again) or of
    the last round (no round left to play) resumes to the bytes of an uninterrupted one. The
    killed runs keep their client store and Context.table tables on disk (training.client_store),
    the uninterrupted one in memory: the same bytes, and the tables come back into their files."""
    def with_drift(folder: str, store: str = "memory") -> Any:
        raw = spec_dict(Path(workdir) / folder, name, client_store=store)
        raw["scenarios"]["s"]["drift"] = [{"round": 3, "fraction": 0.34}]
        raw["scenarios"]["s"]["availability"] = {"share": 0.34, "away": ROUNDS - 2}
        return parse_spec(raw)

    whole = with_drift("whole")
    train_run(whole, "s", name, 0, progress=False)
    for stop_after in (2, 3, ROUNDS):
        with _patched(checkpoint, "MIN_ROWS_BYTES", 1):  # every table through row blocks, into its file
            resumed = _killed_then_resumed(with_drift(f"killed{stop_after}", "disk"), name, stop_after)
        same_bytes(whole.run_dir("s", name, 0), resumed)  # drift.parquet, availability.parquet among the tables


def check_sampled_predictor(name: str, workdir: Path) -> None:
    from cflpipe.fl.predictors import Mixture, Selected

    # close, not equal: a method that trains at evaluation (Per-FedAvg's fine-tuning) may batch 3
    # clients' plans otherwise than 6, which moves the last bits
    def same(u: torch.Tensor, v: torch.Tensor) -> bool:
        return u.shape == v.shape and torch.allclose(u, v, rtol=1e-5, atol=1e-6)

    # two runs that trained alike, so that neither evaluation sees what the other did to the
    # method (IFCA's choice by loss is kept)
    spec = parse_spec(spec_dict(Path(workdir), name))
    runs = [prepare_run(spec, "s", name, 0) for _ in range(2)]
    for run in runs:
        play(run, 3)
    sample = np.array([0, 2, 5])
    some, every = runs[0].method.predictor(sample), runs[1].method.predictor()
    assert type(some) is type(every), f"{type(some).__name__} for a sample, {type(every).__name__} for all"
    if isinstance(every, Mixture):
        assert np.array_equal(np.asarray(some.weights)[sample], np.asarray(every.weights)[sample]), "mixture weights"
        assert all(same(u, v) for u, v in zip(some.models, every.models)), "mixture components"
        if every.rows is not None:  # weights per input row (FedGMM's)
            for c in sample:
                x = runs[0].ctx.data.test.of(int(c))[0]
                owners = np.full(len(x), c)
                assert same(some.rows(x, owners), every.rows(x, owners)), f"client {c}'s weights per row"
    elif isinstance(every, Selected):
        assert all(same(u, v) for u, v in zip(some.models, every.models)), "the models selected from"
    for c in sample:  # each sampled client's model (its largest share for a mixture)
        mine, theirs = some.models[int(some.index[c])], every.models[int(every.index[c])]
        assert same(mine, theirs), f"client {c}'s model differs when the evaluation samples clients"


CHECKS: tuple[Callable[[str, Path], None], ...] = (
    check_k_rule, check_clients_use_only_what_they_were_sent, check_state_round_trip, check_sampled_predictor,
    check_batched_equals_sequential, check_determinism, check_resume, check_outputs_from_last_checkpoint,
    check_evaluation_does_not_change_training, check_streamed_means_equal_held_updates,
    check_new_clients_change_no_training, check_changing_clients_resume)
# Checks that train whole runs (seconds each): pytest's `slow` mark in parametrize_with_checks.
SLOW_CHECKS = (check_determinism, check_resume, check_outputs_from_last_checkpoint,
               check_evaluation_does_not_change_training, check_streamed_means_equal_held_updates,
               check_new_clients_change_no_training, check_changing_clients_resume)


def check_method(name: str, workdir: Path) -> None:
    """Every check on one registered method, each in its own folder under `workdir`."""
    for check in CHECKS:
        check(name, Path(workdir) / check.__name__)


def parametrize_with_checks(names: list[str] | None = None):
    """A pytest parametrization over (method, check) for `names` (default: every registered
    method, plugins' included); the whole-run checks carry the `slow` mark."""
    import pytest

    params = [pytest.param(name, check, id=f"{name}-{check.__name__}",
                           marks=[pytest.mark.slow] if check in SLOW_CHECKS else [])
              for name in (sorted(all_methods()) if names is None else names) for check in CHECKS]
    return pytest.mark.parametrize("method, check", params)
