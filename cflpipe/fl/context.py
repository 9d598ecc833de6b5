"""The context of the method contract (fl/method.py): what a method may use on the server side
(`Context`: data, parameter spaces, settings, seeded randomness, the trainer, questions to
clients) and the engine-owned store of what clients keep (`ClientStore`)."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType
from typing import Any, Iterator

import numpy as np
import torch

from cflpipe.errors import DivergenceError, SpecError
from cflpipe.fl.data import FederatedData
from cflpipe.fl.local import Anchor, LocalResult, steps_for
from cflpipe.fl.messages import ClientView, Payload, Update, round_lr
from cflpipe.fl.params import ParamSpace
from cflpipe.fl.plan import ClientPlan, Plans, Results, Trained
from cflpipe.fl.rowfile import RowFile, copy_rows
from cflpipe.fl.trainers import SequentialTrainer, Trainer
from cflpipe.fl.work import WorkItem
from cflpipe.seeds import mix_seed, rng
from cflpipe.spec import Training


class ClientStore:
    """Client-side state that lives across rounds (personal models, Ditto's v_i, FedAC's ω_i,
    an auxiliary network per client), owned by the engine and checkpointed with the run, so no
    method writes save/load code for it. Each entry is a (clients × …) table whose rows start as
    the default the method registers."""

    def __init__(self, num_clients: int, device: torch.device):
        self.num_clients = num_clients
        self.device = device
        self.tables: dict[str, torch.Tensor] = {}
        self.defaults: dict[str, torch.Tensor] = {}
        # training.client_store: disk: the folder the tables registered from then on live in
        self.folder: Path | None = None
        self.files: dict[str, RowFile] = {}
        self.server_names: set[str] = set()

    def on_disk(self, folder: Path) -> None:
        """Keep the tables registered from now on in files of `folder` (fl/rowfile.py), not in
        memory; their bytes are the same."""
        if self.device.type != "cpu":
            raise SpecError(f"training.client_store: disk keeps the client store in memory-mapped files, "
                            f"which a {self.device.type} device cannot train from; use memory")
        self.folder = Path(folder)

    def add(self, name: str, default: torch.Tensor) -> torch.Tensor:
        if name in self.tables:
            raise KeyError(f"client state {name!r} is already registered")
        self.tables[name] = self._rows(f"client-{name}", default, self.num_clients)
        self.defaults[name] = default.detach().clone()
        return self.tables[name]

    def _rows(self, key: str, default: torch.Tensor, rows: int) -> torch.Tensor:
        """`rows` copies of `default`: in the file `key`.rows where the store is on disk."""
        if self.folder is None:
            return default.detach().unsqueeze(0).repeat(rows, *([1] * default.dim()))
        self.files[key] = RowFile(self.folder / f"{key}.rows", default, rows)
        return self.files[key].tensor

    def server_table(self, name: str, default: torch.Tensor, rows: int) -> torch.Tensor:
        """A server's table of `rows` copies of `default` (Context.table): a file beside the
        store's own where the store is on disk, else in memory."""
        key = f"server-{name}"
        if key in self.server_names:
            raise KeyError(f"server table {name!r} is already made")
        self.server_names.add(key)
        return self._rows(key, default, rows)

    def release(self) -> None:
        """Hand the pages of the tables on disk back to the kernel (after each round)."""
        for file in self.files.values():
            file.release()

    def remove_files(self) -> None:
        """Delete the tables' files (a run that finished keeps what its outputs need elsewhere)."""
        for file in self.files.values():
            file.remove()  # its tensor stays readable (the tables keep it) until they are dropped
        self.files = {}
        if self.folder is not None and self.folder.is_dir() and not any(self.folder.iterdir()):
            self.folder.rmdir()  # an empty folder would keep a failed new run's folder from going

    def fresh(self, num_clients: int) -> "ClientStore":
        """A store of the same tables for other clients, every row at its registered default
        (what a client that never trained keeps)."""
        store = ClientStore(num_clients, self.device)
        for name, default in self.defaults.items():
            store.add(name, default)
        return store

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.tables[name]

    def __setitem__(self, name: str, table: torch.Tensor) -> None:
        if name not in self.tables or table.shape != self.tables[name].shape:
            raise KeyError(f"client state {name!r}: register it with add() and keep its shape")
        if f"client-{name}" in self.files:  # the file stays the table
            copy_rows(self.tables[name], table)
            return
        self.tables[name] = table

    def get(self, name: str, client: int) -> torch.Tensor:
        return self.tables[name][client]

    def set(self, name: str, clients: int | np.ndarray, values: torch.Tensor) -> None:
        if not isinstance(clients, (int, np.integer)):
            clients = torch.as_tensor(np.asarray(clients, dtype=np.int64), device=self.tables[name].device)
        self.tables[name][clients] = values

    def state_dict(self) -> dict[str, torch.Tensor]:
        return dict(self.tables)

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if set(state) != set(self.tables):
            raise KeyError(f"client state holds {sorted(state)}, the method registers {sorted(self.tables)}")
        for name, table in state.items():
            if f"client-{name}" in self.files:
                self[name] = table  # read into the file (the checkpoint's reader may have already)
            else:
                self.tables[name] = table.to(self.device)

    def targets(self) -> dict[str, torch.Tensor]:
        """The store's tables a checkpoint's rows may be read straight into: those on disk."""
        return {name: self.files[f"client-{name}"].tensor for name in self.tables if f"client-{name}" in self.files}


class Context:
    """Everything a method may use: data, the parameter spaces, the client store, settings,
    seeded randomness and the trainer that executes client plans.

    Randomness is derived from (run seed, round, client, purpose) rather than carried in a
    stream, so a resumed run draws exactly what an uninterrupted one would."""

    def __init__(self, data: FederatedData, space: ParamSpace, training: Training, hp: Any,
                 seed: int, init: torch.Tensor, scenario: str, method: str, trainer: Trainer | None = None):
        self.data = data
        self.space = space
        self.spaces: dict[str, ParamSpace] = {"model": space}
        # Each network's initial vector, which every client starts from (seeded: common knowledge).
        self.initial: dict[str, torch.Tensor] = {"model": init}
        self.training = training
        self.hp = hp
        self.seed = seed
        self.init = init
        self.scenario = scenario
        self.method = method
        self.round = 0
        self.device = space.device
        self.trainer = trainer or SequentialTrainer()
        self.clients = ClientStore(data.num_clients, space.device)
        # the clients a full evaluation reads (training.full_eval_clients' sample; None: all),
        # set by the engine
        self.population: np.ndarray | None = None
        # Traffic beyond the sampled clients' payloads and updates (the questions of ask); the
        # engine adds it to the round's bytes and resets it.
        self.extra_bytes_down = 0
        self.extra_bytes_up = 0
        self.client_side: Any = None  # the method's class (Method.__init__ sets it)
        self._train_sizes = data.train.sizes()
        self._dropout = {"model": _has_dropout(space.model)}

    @property
    def num_clients(self) -> int:
        return self.data.num_clients

    def train_sizes(self) -> np.ndarray:
        return self._train_sizes

    def rng(self, *purpose: int) -> np.random.Generator:
        """Server-side randomness for this round (pass extra ints to separate purposes)."""
        return rng(self.seed, self.round, *purpose, 0x5E)

    def lr(self) -> float:
        return round_lr(self.training, self.round)

    def add_space(self, name: str, module: torch.nn.Module) -> ParamSpace:
        """Register an auxiliary network (e.g. a per-client conditional invertible network) that
        plans can train with `space=name`; its per-client vectors live in the client store."""
        if name in self.spaces:
            raise KeyError(f"parameter space {name!r} is already registered")
        self.spaces[name] = ParamSpace(module, self.device)
        self.initial[name] = self.spaces[name].read()
        self._dropout[name] = _has_dropout(module)
        return self.spaces[name]

    def has_dropout(self, space: str) -> bool:
        return self._dropout[space]

    def apply(self, vectors: torch.Tensor | list[torch.Tensor], *inputs: torch.Tensor, space: str = "model",
              call: str = "forward", chunk: int | None = None) -> torch.Tensor:
        """Each parameter vector applied to the same inputs, (vectors × rows × …), by the run's
        trainer (batched or one by one): `network.<call>(*inputs)`, without gradients, in
        evaluation mode, in chunks of `chunk` rows (None: all at once)."""
        return self.trainer.apply(self.spaces[space], vectors, tuple(inputs), call, chunk)

    def apply_each(self, vectors: torch.Tensor | list[torch.Tensor], inputs: list[tuple[torch.Tensor, ...]], *,
                   space: str = "model", call: str = "forward", chunk: int | None = None) -> list[torch.Tensor]:
        """Vector j applied to its own inputs `inputs[j]` (any lengths): one output per vector."""
        return self.trainer.apply(self.spaces[space], vectors, list(inputs), call, chunk)

    # ------------------------------------------------------------------ client plans

    def run(self, plans: dict[int, Plans]) -> dict[int, Results]:
        """Execute client plans with the run's trainer: {client: plan or {name: plan}} in,
        {client: Trained or {name: Trained}} out."""
        jobs: list[tuple[int, ClientPlan]] = []
        where: list[tuple[int, str | None]] = []
        for client, plan in plans.items():
            named = plan.items() if isinstance(plan, dict) else [(None, plan)]
            for name, one in named:
                jobs.append((int(client), one))
                where.append((int(client), name))
        trained = self.execute(jobs)
        out: dict[int, Any] = {}
        for (client, name), result in zip(where, trained):
            if name is None:
                out[client] = result
            else:
                out.setdefault(client, {})[name] = result
        return out

    def run_each(self, plans: dict[int, Plans]) -> Iterator[tuple[int, Results]]:
        """As run, but each client's results are given as the trainer finishes them, so a caller
        can let go of one before the next is trained (the sequential trainer's are one at a
        time; other trainers' come together). Named plans and plans with follow-ups go through
        run (a client is only finished once its follow-ups are)."""
        if any(isinstance(plan, dict) or plan.then is not None for plan in plans.values()):
            yield from self.run(plans).items()
            return
        clients = [int(client) for client in plans]
        results = self.trainer.train_each(self.spaces, [self.work_item(client, plans[client]) for client in clients])
        for client in clients:  # not zip: its reused result tuple would hold a result while the next trains
            yield client, next(results)

    def work_item(self, client: int, plan: ClientPlan) -> WorkItem:
        """A plan with everything its training needs resolved in this process: the client's
        rows (or the plan's inputs), the steps, the optimizer settings, the batch stream's seed."""
        split, t = self.data.train, self.training
        x, y = split.of(client)
        source = (split.x, split.y, int(split.offsets[client])) if plan.inputs is None else None
        if plan.inputs is not None:
            x = plan.inputs
        steps = steps_for(len(y), t.batch_size, t.local_steps, t.local_epochs) if plan.steps is None else plan.steps
        # Dropout is the only consumer of torch's global RNG in the models; it is reseeded per
        # client only where a network has dropout (~65 µs).
        dropout = mix_seed(self.seed, self.round, client, *plan.stream, 1) if self.has_dropout(plan.space) else None
        return WorkItem(
            client=client, network=plan.space, start=plan.start, x=x, y=y, steps=steps, batch_size=t.batch_size,
            lr=self.lr() if plan.lr is None else plan.lr,
            momentum=t.momentum if plan.momentum is None else plan.momentum,
            weight_decay=t.weight_decay if plan.weight_decay is None else plan.weight_decay,
            stream_seed=mix_seed(self.seed, self.round, client, *plan.stream), dropout_seed=dropout,
            loss=plan.loss, rule=plan.rule, anchors=plan.anchors, trainable=plan.trainable,
            companions=plan.companions, source=source, into=plan.into, precision=t.precision)

    def execute(self, jobs: list[tuple[int, ClientPlan]]) -> list[Trained]:
        """Train (client, plan) jobs, then all their follow-ups together (recursively)."""
        trained = self.trainer.train(self.spaces, [self.work_item(client, plan) for client, plan in jobs])
        follow = [(i, client, plan.then(trained[i])) for i, (client, plan) in enumerate(jobs)
                  if plan.then is not None and not trained[i].diverged]
        if follow:
            for (i, _, _), outcome in zip(follow, self.execute([(client, plan) for _, client, plan in follow])):
                trained[i].then = outcome
        return trained

    def train(self, client: int, start: torch.Tensor, anchors: list[Anchor] | tuple[Anchor, ...] = (),
              trainable: torch.Tensor | None = None, steps: int | None = None,
              lr: float | None = None) -> tuple[torch.Tensor, LocalResult]:
        """One plain plan of one client (tests and scripts; methods return plans)."""
        trained = self.run({client: ClientPlan(start, anchors, trainable, steps, lr)})[client]
        return trained.vector, trained.result

    def table(self, name: str, default: torch.Tensor, rows: int | None = None) -> torch.Tensor:
        """A server-side table of one row per client (or `rows`), each `default` to start with
        (the last upload of every client, say): on disk where `training.client_store` is, so that
        resident memory follows what a round touches. Keep it in `checkpoint` and change it in
        place (`table[rows] = …`): a resume reads it back into its file."""
        return self.clients.server_table(name, default, self.num_clients if rows is None else rows)

    def view(self, client: int) -> ClientView:
        """The narrow view a client's step gets (see ClientView)."""
        return ClientView(client, self.round, self.hp, self.training, int(self._train_sizes[client]), self.space,
                          MappingProxyType(self.initial), self.data, self.clients, self.apply, self.seed)

    def sibling(self, data: FederatedData, seed: int) -> "Context":
        """A context over other clients (the new clients of `scenario.new_clients`) that shares
        this one's networks, settings and client side, with its own seed (its clients' randomness is
        their own) and a client store at the registered defaults: what a method's `place` asks them
        through. A new client that diverges is left out, never the run's end (on_divergence skip);
        under `trainer: auto` they train sequentially, so that their plans are never timed and
        recorded as choices the participants' training would then follow."""
        training = self.training.model_copy(update={"on_divergence": "skip"})
        trainer = SequentialTrainer() if self.trainer.name == "auto" else self.trainer
        other = Context(data, self.space, training, self.hp, seed, self.init, self.scenario, self.method, trainer)
        other.spaces, other.initial, other._dropout = self.spaces, self.initial, self._dropout
        other.clients = self.clients.fresh(data.num_clients)
        other.client_side = self.client_side
        return other

    def ask(self, payloads: dict[int, Payload], *, counted: bool = True) -> dict[int, Update]:
        """Ask clients a question outside the round's training (all clients' models in a
        clustering round, pre-training, a loss or a descriptor of their data): each answers by the
        method's client side, `Method.query_plan` (local work, which the trainer executes for all
        of them together, batched where it can) then `Method.query`, over its own view and what it
        was sent. Counts each payload down (less what the client holds, Payload.held) and each
        answer up; what an answer keeps goes to the client store. A client whose training
        diverged sends nothing and is left out, or stops the run (training.on_divergence), as a
        sampled client's update would. `counted=False`: a question of the evaluation (IFCA's
        clients choosing their cluster again to be scored), whose traffic is no part of the
        method's: nothing is counted."""
        side = self.client_side
        if side is None:
            raise RuntimeError("Context.ask: no method's client side answers yet (Method.__init__ sets it)")
        views = {int(c): self.view(int(c)) for c in payloads}
        work = {c: side.query_plan(views[c], payloads[c]) for c in views}
        trained = self.run({c: plans for c, (plans, _) in work.items() if plans is not None})
        answers: dict[int, Update] = {}
        for c, view in views.items():
            if counted:
                self.extra_bytes_down += payloads[c].nbytes
            outcome = trained.get(c)
            if outcome is not None and _diverged(outcome):
                if self.training.on_divergence == "stop":
                    raise divergence_error(self.round, c, self.method, _losses(outcome))
                continue
            answer = side.query(view, payloads[c], outcome, work[c][1])
            if counted:
                self.extra_bytes_up += answer.nbytes
            for name, tensor in answer.keep.items():
                self.clients.set(name, c, tensor)
            answers[c] = answer
        return answers


def _diverged(outcome: Results) -> bool:
    return any(t.diverged for t in (outcome.values() if isinstance(outcome, dict) else [outcome]))


def _losses(outcome: Results) -> float:
    """The loss of a diverged outcome (the first diverged plan's, its follow-up's if that one did)."""
    for t in outcome.values() if isinstance(outcome, dict) else [outcome]:
        if t.diverged:
            return t.then.result.loss if t.then is not None and t.then.diverged else t.result.loss
    return float("nan")


def _has_dropout(module: torch.nn.Module) -> bool:
    return any(isinstance(m, torch.nn.Dropout) for m in module.modules())


def divergence_error(round_index: int, client: int, method: str, loss: float) -> DivergenceError:
    return DivergenceError(f"round {round_index + 1}, client {client}, method {method}: training loss is "
                           f"{loss}; lower training.lr or set training.on_divergence: skip")
