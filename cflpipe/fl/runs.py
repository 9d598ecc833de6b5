"""Run folders and the resolved run: what one run of a spec is, worked out once at the command's
edge and handed down, so that the engine never asks the spec anything (data flows one way, from
the spec to the engine). Also the folder bookkeeping around training: whether a recorded run is
the same run, removing what a failed run left, cutting finished runs' checkpoints down, and the
provenance a run records. The report reads run folders through this module, not the engine."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from cflpipe import __version__, store
from cflpipe.errors import SpecError
from cflpipe.fl.checkpoint import manifest_bytes, read_state, rows_folder, state_bytes, write_state
from cflpipe.fl.data import FederatedData, build_federated_data, input_digests
from cflpipe.spec._models import evaluated_clients
from cflpipe.fl.live import live_dir
from cflpipe.registry import method_info, resolved_hyperparams
from cflpipe.data.base import dataset_info
from cflpipe.models import model_factory
from cflpipe.plugins import distributions_of
from cflpipe.spec import (RUN_OUTPUT_FILES, Spec, Training, dump_yaml, same_trainer_as_sequential, spec_sha256,
                          training_key_path, without_threads)

OUTPUT_FILES = RUN_OUTPUT_FILES
# Held by the process writing a run (flock), in the run's folder.
LOCK_FILE = ".lock"
# In a spec's results folder: the trainer choices `trainer: auto` made for its runs (or the record
# CFLPIPE_TRAINER_CHOICES names: fl/trainer_choice.py's `shared_record`).
TRAINER_CHOICES = "trainer-choices.json"


@dataclass(frozen=True)
class RunResult:
    run_dir: Path
    skipped: bool
    summary: dict[str, Any]

    @property
    def message(self) -> str:
        return self.says("acc_macro", "personalized acc")

    def says(self, figure: str, name: str) -> str:
        """What a finished run prints: its folder and its final `figure` (a tuning trial's: its
        validation accuracy, the figure it is judged by)."""
        verb = "already finished (use --force to re-run)" if self.skipped else "finished"
        value = self.summary.get("final", {}).get(figure)
        figures = f": {name} {value:.4f}" if isinstance(value, float) and value == value else ""
        return f"{self.run_dir}: {verb}{figures}"


def run_plugins(spec: Spec, scenario: str, method: str) -> dict[str, str]:
    """{distribution: version} of the installed packages a run's method, model and dataset come
    from when they are not cflpipe's own: part of the run's definition (its config.yaml), so that
    a new release of a plugin re-runs what it trained, as a new cflpipe release does."""
    return distributions_of((method_info(spec.method_type(method)).cls,
                             model_factory(spec.resolved_training(scenario, method).model),
                             dataset_info(spec.scenarios[scenario].dataset.name).load))


@dataclass(frozen=True)
class ResolvedRun:
    """One run of a spec, resolved once: its identity (the config.yaml it writes), its folder, its
    training settings, hyper-parameters and method, where its data comes from, and the few spec
    facts the engine reports (the whole spec's hash, where a key was written)."""

    scenario: str
    method: str
    method_type: str
    seed: int
    run_dir: Path
    training: Training
    hyperparams: Any  # the method's HyperParams
    config: dict[str, Any]
    config_text: str
    spec_sha256: str
    load_data: Callable[[torch.device], FederatedData]
    key_path: Callable[[str], str]  # where a training key of this run was written in the spec
    live_dir: Path | None = None  # with workflow.live: where its curves go while it trains (fl/live.py)
    # trainer: auto's choices, kept with the results they decide (fl/trainer_choice.py)
    trainer_choices: Path | None = None

    @property
    def state_path(self) -> Path:
        return self.run_dir / "state" / "state.pt"


def resolve_run(spec: Spec, scenario: str, method: str, seed: int, threads: int | None = None) -> ResolvedRun:
    """The run (scenario, method, seed) of `spec`; `threads` as resolved_config records it."""
    config = resolved_config(spec, scenario, method, seed, threads=threads)
    info = method_info(config["method_type"])
    run_dir, training = spec.run_dir(scenario, method, seed), spec.resolved_training(scenario, method)
    # the client store on disk holds the clients' inputs too, beside its tables (Engine.setup,
    # which refuses it on another device than the CPU)
    store = store_folder(run_dir) if training.client_store == "disk" else None
    return ResolvedRun(
        scenario, method, config["method_type"], seed, run_dir,
        training, info.params(**config["hyperparams"]), config, dump_yaml(config),
        spec_sha256(spec), lambda device: build_federated_data(spec, scenario, device, store if device.type == "cpu" else None),
        lambda key: training_key_path(spec, scenario, method, key),
        live_dir(spec.results_dir, scenario, method, seed) if spec.workflow.live else None,
        Path(spec.results_dir) / TRAINER_CHOICES)


def training_definition(spec: Spec, scenario: str, method: str) -> dict[str, Any]:
    """The run's training definition, with full_eval_clients where it samples the clients: runs
    made before it existed read every client, so those it changes (past AUTO_EVAL_CLIENTS under
    auto) are made again, and a value that reads every client (`all` included) redoes none."""
    training, sc = spec.resolved_training(scenario, method), spec.scenarios[scenario]
    definition = training.definition()
    definition.pop("full_eval_clients", None)
    if evaluated_clients(training, sc.participants, bool(sc.drift)) < sc.participants:
        definition["full_eval_clients"] = training.full_eval_clients
    return definition


def recorded(hp: Any) -> dict[str, Any]:
    """The hyper-parameters a run's config.yaml records: a key of the class's `later_defaults`
    left out at its default, so that runs recorded before the key existed stay the same runs."""
    later = type(hp).later_defaults
    return {key: value for key, value in hp.model_dump(mode="json").items() if key not in later or value != later[key]}


def resolved_config(spec: Spec, scenario: str, method: str, seed: int, threads: int | None = None
                    ) -> dict[str, Any]:
    """What a run is made of, written as its config.yaml; `threads` (torch's CPU threads) is
    recorded when given: CPU kernels reduce in a thread-dependent order, so the same run with
    other threads gives other bytes (a run of the spec all the same)."""
    method_type = spec.method_type(method)
    training = training_definition(spec, scenario, method)
    hyperparams = recorded(resolved_hyperparams(spec, scenario, method))
    versions = run_plugins(spec, scenario, method)
    digests = input_digests(spec, scenario)
    return {
        "cflpipe": __version__,
        "scenario": scenario,
        "method": method,
        "method_type": method_type,
        "seed": seed,
        "hyperparams": hyperparams,
        "training": training,
        "scenario_spec": spec.scenarios[scenario].definition(),
        "data_dir": spec.data_dir,
        **({"inputs_sha256": digests} if digests else {}),
        **({"plugins": versions} if versions else {}),
        **({} if threads is None else {"threads": threads}),
    }


def resolve_device(requested: str) -> torch.device:
    if requested == "cuda" and not torch.cuda.is_available():
        raise SpecError("training.device: 'cuda' requested but no CUDA device is available; use auto or cpu")
    device = torch.device("cuda" if requested == "auto" and torch.cuda.is_available() else
                          "cpu" if requested == "auto" else requested)
    if device.type == "cuda":
        # cuBLAS is reproducible only with a fixed workspace, set before its first use.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    return device


def remove_empty(run_dir: Path, existed: Path) -> None:
    """Remove the folders a failed run created, up to the one that existed before it."""
    (run_dir / LOCK_FILE).unlink(missing_ok=True)
    checkpoint_folders = state_folders(run_dir)
    for folder in (*checkpoint_folders, run_dir, *run_dir.parents):
        if folder == existed:
            return
        try:
            folder.rmdir()
        except OSError:  # not empty (a checkpoint to resume from) or gone
            if folder not in checkpoint_folders:
                return


def state_folders(run_dir: Path) -> tuple[Path, Path, Path]:
    """The run's state folders, innermost first: the checkpoint's row blocks, the client store's
    files (training.client_store: disk) and state/."""
    state_path = run_dir / "state" / "state.pt"
    return rows_folder(state_path), store_folder(run_dir), state_path.parent


def store_folder(run_dir: Path) -> Path:
    """Where the client store on disk keeps its tables and the clients' inputs."""
    return run_dir / "state" / "store"


def same_run(recorded: Path, config: dict) -> bool:
    """The run recorded in `recorded` (a config.yaml) is `config`, whatever torch threads each
    was made with: a finished run is not redone for another thread count (nor for the count
    that runs written before it was recorded lack)."""
    import yaml

    try:
        old = yaml.safe_load(recorded.read_text())
    except (OSError, yaml.YAMLError):
        return False
    return isinstance(old, dict) and without_threads(old) == without_threads(config)


def checkpoint_of(recorded: object, config_text: str) -> bool:
    """A checkpoint's config text `recorded` is this run's `config_text`: the same text (threads
    included: they change the sums' last bits, so a state from other threads would not resume to
    the same bytes), or a text written before `processes` and `distributed` were recorded as the
    `sequential` whose bytes they give, naming one of them."""
    if recorded == config_text:
        return True
    if not isinstance(recorded, str) or "trainer: " not in recorded:
        return False
    import yaml

    try:
        old = yaml.safe_load(recorded)
    except yaml.YAMLError:
        return False
    if not isinstance(old, dict) or not isinstance(old.get("training"), dict):
        return False
    return dump_yaml({**old, "training": same_trainer_as_sequential(old["training"])}) == config_text


def config_differences(old_text: str, new_text: str) -> list[str]:
    """The dotted keys (`training.threads`, `method.mu`) whose values differ between two run
    configs, as YAML texts; ["config"] when one is not a mapping."""
    import yaml

    def flat(value: Any, prefix: str = "") -> dict[str, Any]:
        if isinstance(value, dict) and value:
            return {k: v for key, item in value.items() for k, v in flat(item, f"{prefix}{key}.").items()}
        return {prefix.rstrip("."): value}

    try:
        old, new = yaml.safe_load(old_text), yaml.safe_load(new_text)
    except yaml.YAMLError:
        return ["config"]
    if not isinstance(old, dict) or not isinstance(new, dict):
        return ["config"]
    a, b = flat(old), flat(new)
    return sorted(key for key in a.keys() | b.keys() if a.get(key, ...) != b.get(key, ...))


def read_json(path: Path) -> dict:
    import json

    return json.loads(path.read_text())


@dataclass(frozen=True)
class Cleaned:
    run_dir: Path
    freed: int | None  # bytes; None: the run is being written by another process, left alone


def clean_runs(spec: Spec, dry_run: bool = False) -> list[Cleaned]:
    """Cut the checkpoints of the spec's finished runs down to their tables (what `keep_state:
    false` keeps), whatever keep_state they ran with; returns the runs whose checkpoint shrank
    (or would) and those another process holds.

    A run counts as finished when every output exists and its checkpoint is of its last round and
    of the run its config.yaml records: such a checkpoint is never resumed into another round, so
    dropping its models changes nothing a later `cflpipe train` writes. Anything else (a run that
    is training, was killed, or whose checkpoint is of an earlier definition) is left alone."""
    from cflpipe.errors import BusyError

    cleaned = []
    for scenario, method, seed in spec.matrix():
        run_dir = spec.run_dir(scenario, method, seed)
        if not (run_dir / "state" / "state.pt").is_file() or \
                not all((run_dir / name).is_file() for name in OUTPUT_FILES):
            continue
        try:
            with store.exclusive(run_dir / LOCK_FILE, f"run {scenario}/{method}/seed{seed} ({run_dir})"):
                freed = _cut_down_state(run_dir, dry_run)
        except BusyError:
            cleaned.append(Cleaned(run_dir, None))
            continue
        if freed is not None:
            cleaned.append(Cleaned(run_dir, freed))
    return cleaned


def _cut_down_state(run_dir: Path, dry_run: bool) -> int | None:
    """Bytes freed by dropping the models from a finished run's checkpoint; None when it is not
    one to cut down (see clean_runs)."""
    import yaml

    path = run_dir / "state" / "state.pt"
    state, problem = read_state(path)
    if problem is None:
        state.pop("__previous__", None)  # rewritten whole below: the previous one becomes the newest
    config_text = (run_dir / "config.yaml").read_text()
    if problem is not None or state.get("method") is None or state.get("config") != config_text:
        return None
    training = (yaml.safe_load(config_text) or {}).get("training") or {}
    if int(state["round"]) != training.get("rounds"):
        return None
    before = state_bytes(path)
    cut = {**state, "method": None, "clients": None}
    if dry_run:
        return before - manifest_bytes(cut)  # the tables alone: no row blocks
    write_state(path, cut)
    return before - state_bytes(path)


# Provenance records what made a run; mutation testing leaves it out (no figure depends on it).
def run_provenance(config: dict, training: Training) -> dict[str, Any]:  # pragma: no mutate block
    """What made a run, in summary.json: the same for the same run (scenario, method, seed,
    resolved settings) and installation, so a re-run or a resumed run writes the same bytes.
    `config_sha256` hashes the run's config.yaml without the thread count and data_dir (a place,
    not part of what the run is). The whole spec's hash is not here: entries that have nothing to
    do with this run (another seed, another method) would change it; it goes to timing.json."""
    import hashlib
    import platform

    identity = {k: v for k, v in config.items() if k not in ("threads", "data_dir")}
    return {"cflpipe": __version__, "torch": torch.__version__, "python": platform.python_version(),
            "device_requested": training.device,
            "config_sha256": hashlib.sha256(dump_yaml(identity).encode()).hexdigest()}


def volatile_provenance(run_dir: Path) -> dict[str, Any]:  # pragma: no mutate block
    """When and from which checkout a run finished, in timing.json (never compared byte for
    byte): the UTC time, and the git commit of the checkout holding the results (None outside
    one, or without git) with whether tracked files differed from it."""
    import datetime
    import subprocess

    finished = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()
    commit, dirty = None, None
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C"}
    try:
        head = subprocess.run(["git", "-C", str(run_dir), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, env=env)
        if head.returncode == 0 and head.stdout.strip():
            commit = head.stdout.strip()
            status = subprocess.run(["git", "-C", str(run_dir), "status", "--porcelain", "--untracked-files=no"],
                                    capture_output=True, text=True, timeout=30, env=env)
            dirty = bool(status.stdout.strip()) if status.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):  # no git, or a slow file system: unknown
        pass
    return {"finished_utc": finished, "git_commit": commit, "git_dirty": dirty}


