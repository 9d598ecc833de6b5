"""A run's checkpoints: written after the rounds `checkpoint_every` names, cleared for a run
trained afresh, and read back on resume when they belong to the run's configuration (the engine's
Run, `run`, named in words: fl/engine.py imports this module)."""

from __future__ import annotations

import shutil
import sys
from collections import defaultdict
from pathlib import Path

from cflpipe.fl import rowfile
from cflpipe.fl.checkpoint import STATE_HASH_FILE, adopt_previous, read_state, rows_folder, write_state
from cflpipe.fl.runs import checkpoint_of, config_differences


def save_state(run, round_number: int) -> None:
    # A run resumed after its last round plays no round: its outputs come from the tables
    # alone. So the last checkpoint leaves out the models and the method's state (nearly all
    # of its size) unless training.keep_state asks for them.
    final = round_number == run.training.rounds and not run.training.keep_state
    state = {
        "round": round_number,
        "config": run.config_text,
        "method": None if final else run.method.state_dict(),
        "clients": None if final else run.ctx.clients.state_dict(),
        "tables": {name: dict(cols) for name, cols in run.tables.items()},
        "trainer": run.trainer.state_dict(),
    }
    # what the axes carry between evaluations, where one does (absent otherwise: such runs'
    # checkpoints stay as they were)
    axes = {axis.name: kept for axis in run.axes if (kept := axis.state())}
    if axes:
        state["axes"] = axes
    write_state(run.state_path, state)


def hash_path(run) -> Path:
    return run.state_path.with_name(STATE_HASH_FILE)


def discard_state(run) -> None:
    """Remove the checkpoint (state.pt, a folder in its place included), its digests and row
    blocks: what remains of a checkpoint is then always the one its digests vouch for."""
    if run.state_path.is_dir():
        shutil.rmtree(run.state_path)
    else:
        run.state_path.unlink(missing_ok=True)
    hash_path(run).unlink(missing_ok=True)
    shutil.rmtree(rows_folder(run.state_path), ignore_errors=True)


def try_resume(run) -> None:
    if not run.state_path.exists():
        return
    if run.state_path.is_dir():  # not ours to have made: said, then cleared like a damaged file
        print(f"warning: {run.state_path}: a folder, not a checkpoint; starting the run afresh", file=sys.stderr)
        discard_state(run)
        return
    # tables on disk (the client store's, a method's Context.table) are read back into their files
    targets = {("clients", name): table for name, table in run.ctx.clients.targets().items()}
    targets.update({("method", name): value for name in run.method.checkpoint
                    if rowfile.owner(value := getattr(run.method, name, None)) is not None})
    state, problem = read_state(run.state_path, targets,
                                wanted=lambda state: checkpoint_of(state.get("config"), run.config_text))
    previous = problem is None and state.pop("__previous__", False)
    if problem is None and checkpoint_of(state.get("config"), run.config_text) and state.get("method") is None \
            and int(state["round"]) != run.training.rounds:
        problem = "a checkpoint without models before the last round"  # cannot be written
    if problem is not None:
        print(f"warning: {run.state_path}: {problem}; starting the run afresh", file=sys.stderr)
        discard_state(run)
        return
    if not checkpoint_of(state.get("config"), run.config_text):
        # the spec changed (or the thread count, whose sums differ in the last bits): the old
        # state does not belong to this run
        changed = config_differences(str(state.get("config")), run.config_text)
        print(f"warning: {run.state_path}: a checkpoint of another configuration (differs in "
              f"{', '.join(changed[:5])}{', …' if len(changed) > 5 else ''}); starting the run afresh",
              file=sys.stderr)
        return
    if previous:
        adopt_previous(run.state_path)
        print(f"warning: {run.state_path}: the last checkpoint's save was interrupted; resuming from "
              f"the one before it (round {int(state['round'])})", file=sys.stderr)
    if state["method"] is not None:  # None: the last round's cut-down checkpoint, no round to play
        run.method.load_state_dict(state["method"])
        run.ctx.clients.load_state_dict(state["clients"])
    run.tables = {name: defaultdict(list, cols) for name, cols in state["tables"].items()}
    for axis in run.axes:
        if axis.name in state.get("axes", {}):
            axis.load_state(state["axes"][axis.name])
    run.trainer.load_state_dict(state.get("trainer") or {})  # absent from checkpoints before auto measured
    run.start_round = int(state["round"])
