"""The method interface the engine drives (after Flower's Strategy and ClientApp: the server
configures a round, each client's local work is a plan the engine's trainer executes, the server
aggregates). A method never loops over rounds or local steps itself and never touches the
engine's internals; what differs between methods is data: which anchors pull the local
objective, which parameters are shared, which loss and step rule, how many models travel down."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Iterator, Mapping

import numpy as np
import torch

from cflpipe.errors import DivergenceError
from cflpipe.fl.data import FederatedData
from cflpipe.fl.local import Anchor, LocalResult, steps_for
from cflpipe.fl.params import ParamSpace
from cflpipe.fl.plan import ClientPlan, Plans, Results, Trained
from cflpipe.fl.predictors import Models, Predictor
from cflpipe.fl.trainers import SequentialTrainer, Trainer
from cflpipe.seeds import mix_seed, rng
from cflpipe.fl.work import WorkItem
from cflpipe.metrics import tensor_bytes
from cflpipe.registry import Capabilities, bind_declared
from cflpipe.spec import Training


@dataclass
class Payload:
    """What the server sends one client this round; its tensors are counted as bytes down, but
    those named in `held`: what the client already holds this round (its round payload, an earlier
    question's), sent again only for the client side's convenience (Context.ask)."""

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    held: tuple[str, ...] = ()

    @property
    def nbytes(self) -> int:
        return tensor_bytes(*(tensor for name, tensor in self.tensors.items() if name not in self.held))


@dataclass
class Update:
    """What one client sends back; its tensors are counted as bytes up. `keep` is what the
    client keeps for later rounds (a personal model, a head): never sent, stored in the
    engine's client store when the update is accepted (not when its training diverged)."""

    tensors: dict[str, torch.Tensor]
    n: int  # training samples of the client (aggregation weight)
    result: LocalResult
    meta: dict[str, Any] = field(default_factory=dict)
    keep: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return tensor_bytes(*self.tensors.values())


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

    def add(self, name: str, default: torch.Tensor) -> torch.Tensor:
        if name in self.tables:
            raise KeyError(f"client state {name!r} is already registered")
        self.tables[name] = default.detach().unsqueeze(0).repeat(self.num_clients, *([1] * default.dim()))
        self.defaults[name] = default.detach().clone()
        return self.tables[name]

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
        self.tables = {name: table.to(self.device) for name, table in state.items()}


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
        self.client_side: type[Method] = Method  # the method's class, set as it is made
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

    def ask(self, payloads: dict[int, Payload]) -> dict[int, Update]:
        """Ask clients a question outside the round's training (all clients' models in a
        clustering round, pre-training, a loss or a descriptor of their data): each answers by the
        method's client side, `Method.query_plan` (local work, which the trainer executes for all
        of them together, batched where it can) then `Method.query`, over its own view and what it
        was sent. Counts each payload down (less what the client holds, Payload.held) and each
        answer up; what an answer keeps goes to the client store. A client whose training
        diverged sends nothing and is left out, or stops the run (training.on_divergence), as a
        sampled client's update would."""
        side = self.client_side
        views = {int(c): self.view(int(c)) for c in payloads}
        work = {c: side.query_plan(views[c], payloads[c]) for c in views}
        trained = self.run({c: plans for c, (plans, _) in work.items() if plans is not None})
        answers: dict[int, Update] = {}
        for c, view in views.items():
            self.extra_bytes_down += payloads[c].nbytes
            outcome = trained.get(c)
            if outcome is not None and _diverged(outcome):
                if self.training.on_divergence == "stop":
                    raise divergence_error(self.round, c, self.method, _losses(outcome))
                continue
            answer = side.query(view, payloads[c], outcome, work[c][1])
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


# What an answer that trained nothing reports as its training (Context.ask).
NOT_TRAINED = LocalResult(0.0, 0, 0)
# The question that sends a new client what serves it (Method.served): it answers nothing.
SERVE = "serve"
# The question "do what a sampled client does in a round" (Method.query_plan, Method.query).
ROUND = "round"


@dataclass(frozen=True)
class ClientView:
    """What one client's step may use, and nothing else (Flower's ClientApp gets a message and its
    own Context.state): its own data, its own rows of the client store, the run's model
    application, its seeded randomness, its hyper-parameters and the training settings. A method
    whose client side is written over a view (`Method.client_plan`/`client_finish`, static) can
    read no server state and no other client's; it returns its scratch instead of writing it
    anywhere."""

    client: int
    round: int
    hp: Any
    training: Training
    samples: int  # its training samples (its update's weight)
    # The model's parameter layout (the masks of its layers: body, head, first layers; its working
    # vector is the trainer's, not the client's) and each network's initial vector, which every
    # client starts from (shared with the server: copy before changing one in place).
    space: ParamSpace
    initial: "Mapping[str, torch.Tensor]"
    _data: FederatedData
    _store: "ClientStore"
    _apply: Any
    _seed: int

    def data(self, split: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
        """The client's own inputs and targets of a split."""
        return self._data.client(self.client, split)

    @property
    def classes(self) -> int:
        """The number of labels of the run's data set."""
        return int(self._data.num_classes)

    def kept(self, name: str) -> torch.Tensor:
        """A copy of what the client keeps under `name` (its row of the client store)."""
        return self._store.get(name, self.client).clone()

    def apply(self, vectors: torch.Tensor, *inputs: torch.Tensor, **options: Any) -> torch.Tensor:
        """Context.apply: parameter vectors applied to inputs by the run's trainer."""
        return self._apply(vectors, *inputs, **options)

    def rng(self, *purpose: int) -> np.random.Generator:
        """Client-side randomness of this round, seeded by (run seed, round, client, purpose): the
        stream Context.rng(client, *purpose) gives."""
        return rng(self._seed, self.round, self.client, *purpose, 0x5E)

    def lr(self) -> float:
        """This round's learning rate (training.lr decayed by lr_decay per round), as Context.lr."""
        return round_lr(self.training, self.round)

    def torch_generator(self, *purpose: int) -> torch.Generator:
        """A CPU torch generator seeded by (run seed, round, client, purpose)."""
        return torch.Generator().manual_seed(mix_seed(self._seed, self.round, self.client, *purpose))

    def update(self, tensors: dict[str, torch.Tensor], trained: Trained,
               keep: dict[str, torch.Tensor] | None = None, **meta: Any) -> Update:
        """The client's Update, weighted by its training samples, with the loss record of `trained`;
        `keep` is what the client keeps (stored, never sent), `meta` what the server reads beside
        the tensors (not counted as bytes: small scalars such as a loss)."""
        # A diverged follow-up (FCCA's cINN) makes the whole update a diverged one.
        result = trained.then.result if trained.then is not None and trained.then.diverged else trained.result
        return Update(tensors, self.samples, result, meta=meta, keep=keep or {})

    def answer(self, tensors: dict[str, torch.Tensor], keep: dict[str, torch.Tensor] | None = None,
               **meta: Any) -> Update:
        """The client's answer to a question that trained nothing (Method.query), as `update`."""
        return Update(tensors, self.samples, NOT_TRAINED, meta=meta, keep=keep or {})


# Hooks whose override makes a class's clients or models its own: an inherited rule for new
# clients (Method.place) then no longer applies.
_WHAT_A_RULE_READS = ("client_plan", "client_finish", "predictor", "cluster_models", "cluster_client_finish")
# The server-object client hooks of before the one client form (#45); a class defining one is refused.
_REMOVED_CLIENT_HOOKS = ("plan", "finish", "start_client", "end_client", "local_update", "anchors", "cluster_finish")
# Hooks of before #45 that became the engine's (receive, streams_means) or the registration's
# (clustering_starts, premises: register(..., starts=, premises=)).
_REMOVED_HOOKS = {"receive": "the engine passes the round's updates to aggregate(updates) (or aggregate_means)",
                  "streams_means": "declare streamed_means; the engine sums uploads for a class that does",
                  "clustering_starts": "pass starts=(hp -> (key, round) | None) to register()",
                  "premises": "pass premises=(hp, training, scenario -> [(key, text)]) to register()"}
# The evaluation hooks of before the one evaluation shape (#45), all replaced by predictor().
_REMOVED_EVAL_HOOKS = ("eval_params", "eval_models", "eval_models_of", "eval_mixture", "row_mixture", "select_model",
                       "selects_by_data", "cluster_eval_models", "cluster_eval_models_of")


def streams_means(cls: type[Method]) -> bool:
    """Whether the engine sums a class's uploads as they come (it declares streamed_means). A
    subclass that overrides aggregate reads the round's updates itself: defining it clears
    streamed_means (Method.__init_subclass__), for it and its subclasses (FedAvgM's momentum is in
    its aggregate) unless one declares streamed_means again; one that overrides only
    aggregate_means is streamed, its override used on both paths."""
    return bool(cls.streamed_means)


def receive(method: Method, updates: dict[int, Update]) -> None:
    """The accepted updates of a round (the held path): what clients keep goes to the client
    store, then the method aggregates."""
    for client, update in updates.items():
        for name, tensor in update.keep.items():
            method.ctx.clients.set(name, client, tensor)
    method.aggregate(updates)


def client_work(method: Method, client: int, payload: Payload) -> tuple[Plans, Any]:
    """A sampled client's plans and scratch, from the method's client side over the client's view;
    where the method names a table for uploads (`uploads_into`), its plan trains into the client's
    row of it."""
    plans, scratch = type(method).client_plan(method.ctx.view(client), payload)
    if method.uploads_into is not None:
        plans.into = getattr(method, method.uploads_into)[client]
    return plans, scratch


def client_update(method: Method, client: int, payload: Payload, trained: Results, scratch: Any) -> Update:
    """A sampled client's Update, from the method's client side over the client's view."""
    return type(method).client_finish(method.ctx.view(client), payload, trained, scratch)


def local_update(method: Method, client: int, payload: Payload) -> Update:
    """One client's whole round (plan, train, finish), for tests and scripts; the engine does the
    same for all sampled clients at once, so that the trainer can batch them."""
    plans, scratch = client_work(method, client, payload)
    trained = method.ctx.run({client: plans})[client]
    return client_update(method, client, payload, trained, scratch)


def round_lr(training: Training, round_index: int) -> float:
    """The learning rate of a round: training.lr decayed by lr_decay once per round."""
    return training.lr * training.lr_decay ** round_index


def _has_dropout(module: torch.nn.Module) -> bool:
    return any(isinstance(m, torch.nn.Dropout) for m in module.modules())


def divergence_error(round_index: int, client: int, method: str, loss: float) -> DivergenceError:
    return DivergenceError(f"round {round_index + 1}, client {client}, method {method}: training loss is "
                           f"{loss}; lower training.lr or set training.on_divergence: skip")


@dataclass
class Placement:
    """Where a method places the clients that never trained (scenario `new_clients`) and what
    serves them: `clusters[c]` new client c's cluster (−1: none), `predictor` what it predicts
    with (fl/predictors.py, indexed by new client)."""

    clusters: np.ndarray
    predictor: Predictor


class Method:
    """Base class. A built-in subclass is declared beside its module (`X_params.py`) and bound to its
    declaration as it is defined; a plugin's registers with cflpipe.methods.register and declares
    its capabilities. Each names the server attributes to checkpoint and overrides the hooks. A round, as the engine drives it:

        round_start(sampled)                       server: (re)cluster, choose K, …
          ctx.ask({client: payload})               its questions outside the round's training:
          query_plan(view, payload), query(…)      answered over the client's view, counted
        payload(client) -> Payload                 bytes down
        client_plan(view, payload) -> plans        the client's local work, as data
        (the trainer executes all sampled clients' plans)
        client_finish(view, payload, trained, scratch) -> Update   bytes up
        aggregate(updates)                         server

    Client-side state that outlives a round goes in ctx.clients (checkpointed by the engine);
    server state is the attributes named in `checkpoint` (tensors, NumPy arrays, numbers, None)."""

    name = "method"
    capabilities = Capabilities()
    checkpoint: tuple[str, ...] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Hooks of older forms would be silently ignored, whether the class or a mixin it lists
        # defines them: Method defines none of these names, so any the class has is refused.
        old = [name for name in _REMOVED_CLIENT_HOOKS if hasattr(cls, name)]
        if old:
            raise TypeError(f"{cls.__module__}.{cls.__qualname__} defines {old[0]}(), a hook cflpipe no longer "
                            f"calls: write the client side as the classmethods client_plan(view, payload) and "
                            f"client_finish(view, payload, trained, scratch) (docs/extending.md)")
        old = [name for name in _REMOVED_EVAL_HOOKS if hasattr(cls, name)]
        if old:
            raise TypeError(f"{cls.__module__}.{cls.__qualname__} defines {old[0]}, an evaluation hook cflpipe no "
                            f"longer calls: return what the clients predict with from predictor(clients) "
                            f"(Models, Selected or Mixture, cflpipe.fl.predictors; docs/extending.md)")
        moved = [name for name in _REMOVED_HOOKS if hasattr(cls, name)]
        if moved:
            raise TypeError(f"{cls.__module__}.{cls.__qualname__} defines {moved[0]}(), which is no longer a method "
                            f"hook: {_REMOVED_HOOKS[moved[0]]} (docs/extending.md)")
        if "place" not in vars(cls) and any(hook in vars(cls) for hook in _WHAT_A_RULE_READS):
            # Its clients or its models differ from its parent's: the parent's rule for new
            # clients is not its rule, and no method is silently given another's.
            cls.place, cls.newcomer_rule = Method.place, ""
        if "aggregate" in vars(cls) and "streamed_means" not in vars(cls):
            cls.streamed_means = ()  # its aggregate reads the round's updates: they are held for it
        bind_declared(cls)  # a built-in's name and capabilities, from its declaration

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.hp = ctx.hp
        ctx.client_side = type(self)  # who answers the server's questions (Context.ask)

    # --- server → client
    def payload(self, client: int) -> Payload:
        raise NotImplementedError

    # --- client side, over the client's view (classmethods: no server state in reach)
    @classmethod
    def client_plan(cls, view: ClientView, payload: Payload) -> tuple[Plans, Any]:
        """The client's local work as plans ({name: plan} for several), and its scratch: what its
        finishing step needs of its planning (None if nothing)."""
        raise NotImplementedError

    @classmethod
    def client_finish(cls, view: ClientView, payload: Payload, trained: Results, scratch: Any) -> Update:
        """The client's Update from what its plans trained (view.update)."""
        raise NotImplementedError

    # --- questions outside the round (Context.ask), over the client's view as well
    @classmethod
    def query_plan(cls, view: ClientView, payload: Payload) -> tuple[Plans | None, Any]:
        """The local work a client's answer to a question needs, as client_plan's (plans for the
        trainer, and scratch for query); (None, None) where the answer trains nothing. Asked
        ROUND, a client does what a sampled client does in a round (client_plan)."""
        if payload.meta.get("question") == ROUND:
            return cls.client_plan(view, payload)
        return None, None

    @classmethod
    def query(cls, view: ClientView, payload: Payload, trained: Results | None, scratch: Any) -> Update:
        """The client's answer to a question of the server's (Context.ask): view.update(tensors,
        trained) after training, view.answer(tensors) without. A method that asks more than one
        question tells them apart by the payload (its meta's "question")."""
        if payload.meta.get("question") == SERVE:  # a new client receives what serves it
            return view.answer({})
        if payload.meta.get("question") == ROUND and trained is not None:  # as in a round
            return cls.client_finish(view, payload, trained, scratch)
        raise NotImplementedError(f"{cls.__name__} asks its clients a question (Context.ask) but does not "
                                  f"answer it: define query(view, payload, trained, scratch)")

    # The name of a (clients × parameters) server table a client's trained model is written into
    # as it trains, in the client's row (K-means CFL's `latest`): the server's copy of every upload
    # without a round-long second copy. None: uploads arrive as their own tensors.
    uploads_into: str | None = None

    # --- server side
    # Update keys whose sample-weighted means are all a round's aggregation reads (FedAvg's
    # "model"); a class attribute. The engine then adds each accepted upload to running sums as
    # its client finishes and calls aggregate_means, so a round never holds its uploads (#32
    # item 8); aggregate(updates) should be aggregate_means of average_updates (the same bits).
    streamed_means: tuple[str, ...] = ()

    def aggregate_means(self, means: dict[str, torch.Tensor]) -> None:
        """The round's aggregation from the sample-weighted means of streamed_means over the
        accepted updates (not called when none was accepted)."""
        raise NotImplementedError

    def aggregate(self, updates: dict[int, Update]) -> None:
        raise NotImplementedError

    def round_start(self, sampled: np.ndarray) -> None:
        """Called before the sampled clients train (e.g. to re-cluster)."""

    # --- new clients (scenario new_clients): at every full evaluation
    # What the method does with a client it never trained with, in a sentence (`cflpipe methods`
    # NAME); "" where it has no rule: its new-client figures are NaN and it is reported as such.
    newcomer_rule: str = ""

    def place(self, newcomers: Context) -> Placement | None:
        """Place the new clients by the method's own rule: ask them (`newcomers.ask`: the sibling
        context over their data; what they are sent and send back is counted apart, as
        new_bytes_down/up) and say where each goes and what serves it (`served`). Must change no
        state of the method (a conformance check). None: no rule."""
        return None

    @staticmethod
    def served(newcomers: Context, clusters: np.ndarray, models: list[torch.Tensor], index: np.ndarray) -> Placement:
        """The placement that serves new client c with models[index[c]], sent to it (counted)."""
        newcomers.ask({c: Payload({"model": models[int(index[c])]}, {"question": SERVE})
                       for c in range(newcomers.num_clients)})
        return Placement(np.asarray(clusters, dtype=np.int64), Models(list(models), np.asarray(index, dtype=np.int64)))

    # --- evaluation
    def predictor(self, clients: np.ndarray | None = None) -> Predictor:
        """What the clients predict with at this evaluation round (fl/predictors.py): Models (a
        model per client, by index), Selected (a model chosen by the inputs) or Mixture. `clients`:
        the clients a sampled evaluation reads (training.eval_clients, or full_eval_clients'
        sample of the population), None for all; a method
        whose models cost work per client (IFCA's choice by loss, Per-FedAvg's fine-tuning) does
        that work for these only, and the entries of the others are not read."""
        raise NotImplementedError

    def assignment(self) -> np.ndarray | None:
        """Cluster of every client (for clusters.parquet); None for non-clustered methods."""
        return None

    def round_metrics(self) -> dict[str, float]:
        """Extra round-level figures written to rounds.parquet (e.g. FedAC's G values)."""
        return {}

    # --- conformance (cflpipe.testing)
    @classmethod
    def check_hyperparams(cls, params: type) -> dict[str, Any]:
        """Hyper-parameters under which the method's mechanism acts within the conformance
        checks' 4 rounds of 3 of 6 clients (cluster from round 1, split early); `params` is the
        registered entry's HyperParams class (a variant's, for variants)."""
        return {}

    # --- degeneration (a clustered method that ends up as FedAvg must say so)
    def gate_note(self, rounds: Any) -> str | None:
        """After a run: "never clustered: <why>" when a gate of its own stayed shut (e.g. FedTSDP's
        Hopkins test), read from the run's rounds table (a pandas DataFrame: the outputs are rebuilt
        from it without the method's state); None when it opened or the method has none. A gate
        that opened without its clustering ever splitting the clients is said here too."""
        return None

    def collapse_note(self, rounds: Any) -> str | None:
        """After a run whose clients stay in several clusters that all ended with one model (AWCFL's
        Eq. 2 at β = (K−1)/K gives every cluster the mean of all), why, as one line; read from the
        rounds table and the hyper-parameters, as `gate_note`. None otherwise."""
        return None

    def clustering_hint(self, rounds: Any, kind: str) -> str | None:
        """After a run whose clustering came to none (`kind`: fl/diagnosis.KINDS), what of the
        method's own settings did it, when the method can tell from the rounds table (PACFL: a
        threshold below every angle between two clients); appended to the run's warning line."""
        return None

    def eval_tables(self) -> dict[str, dict[str, np.ndarray]]:
        """Tables of the method's own, recorded at every evaluation round: {name: {column:
        values}}, written as `<name>.parquet` with the round in front (e.g. FCCA's similarity
        matrix, `similarity.parquet`). Columns must keep their names and types across rounds."""
        return {}

    def pair_table(self, matrix: torch.Tensor) -> dict[str, np.ndarray]:
        """A (clients × clients) matrix of the server's as an eval table, long format: client,
        other, value; the pairs of the clients full evaluations read (training.full_eval_clients'
        sample: 10,000 clients' 100 M pairs an evaluation were past 8 GiB as table rows, #59),
        every pair where they read every client."""
        clients = self.ctx.population
        if clients is None:
            clients = np.arange(self.ctx.num_clients)
        else:
            index = torch.from_numpy(clients).to(matrix.device)
            matrix = matrix[index[:, None], index[None, :]]
        n = len(clients)
        return {"client": np.repeat(clients, n), "other": np.tile(clients, n), "value": matrix.reshape(-1).cpu().numpy()}

    # --- resume: the attributes named in `checkpoint`
    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {}
        for name in self.checkpoint:
            value = getattr(self, name)
            # torch.load(weights_only=True) takes tensors, containers and plain numbers only.
            state[name] = {"ndarray": torch.from_numpy(np.array(value))} if isinstance(value, np.ndarray) else value
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if set(state) != set(self.checkpoint):
            raise KeyError(f"{self.name}: state holds {sorted(state)}, expected {sorted(self.checkpoint)}")
        for name in self.checkpoint:
            value = state[name]
            if isinstance(value, dict) and set(value) == {"ndarray"}:
                value = value["ndarray"].numpy()
            elif isinstance(value, torch.Tensor):
                value = value.to(self.ctx.device)
            setattr(self, name, value)


def stack_updates(updates: dict[int, Update], key: str = "model") -> tuple[np.ndarray, torch.Tensor, torch.Tensor]:
    """Clients, their uploaded vectors as one (clients × parameters) matrix, and their weights.
    Each update's `key` tensor is replaced by its row of the matrix (same values)."""
    clients = np.fromiter(updates, dtype=np.int64)
    if len(clients) == 0:
        raise ValueError("stack_updates: no updates")
    first = updates[int(clients[0])].tensors[key]
    vectors = torch.empty((len(clients), *first.shape), dtype=first.dtype, device=first.device)
    for row, client in enumerate(clients):
        tensor = updates[client].tensors[key]
        if tensor.shape != first.shape or tensor.dtype != first.dtype:  # torch.stack's check
            raise ValueError(f"stack_updates: client {client}'s {key!r} is {tuple(tensor.shape)} {tensor.dtype}, "
                             f"client {clients[0]}'s {tuple(first.shape)} {first.dtype}")
        vectors[row] = tensor
        # The update reads its row from now on, so the client's own copy is freed as the matrix
        # fills: a round holds its uploads once, not twice (at 2,000 clients × 221 KB, 442 MB).
        # With the batched trainer the uploads are rows of one matrix per group, freed with the
        # group's last row.
        updates[client].tensors[key] = vectors[row]
    weights = torch.tensor([updates[c].n for c in clients], dtype=vectors.dtype, device=vectors.device)
    return clients, vectors, weights


def take_rows(vectors: dict[int, torch.Tensor]) -> tuple[np.ndarray, torch.Tensor]:
    """The clients (sorted) and their vectors as one matrix, each vector moved out of the dict as
    its row is written: a clustering round that heard from every client (FL+HC's, FeSEM's first)
    holds their models once, not twice (2 GiB at 10,000 clients of the mlp, #59)."""
    clients = np.array(sorted(vectors), dtype=np.int64)
    first = vectors[int(clients[0])]
    matrix = torch.empty((len(clients), *first.shape), dtype=first.dtype, device=first.device)
    for row, client in enumerate(clients):
        matrix[row] = vectors.pop(int(client))
    return clients, matrix


class WeightedSum:
    """Σ n_i v_i and Σ n_i over vectors added one at a time, the sum in float64.

    In float64 the order of the additions hardly shows (a float32 vector times an integer
    weight is exact there; each addition rounds at 2⁻⁵³): the mean equals a stacked float32
    mean to float32 rounding, and the same additions in the same order give the same bits, so
    a run is bit-identical with itself whether its uploads were held or summed as they came."""

    def __init__(self) -> None:
        self.total: torch.Tensor | None = None
        self.weight = 0
        self.dtype: torch.dtype | None = None

    def add(self, vector: torch.Tensor, weight: int) -> None:
        if self.total is None:
            self.total = torch.zeros(vector.shape, dtype=torch.float64, device=vector.device)
            self.dtype = vector.dtype
        elif vector.shape != self.total.shape or vector.dtype != self.dtype:
            raise ValueError(f"WeightedSum: a {tuple(vector.shape)} {vector.dtype} vector added to a sum of "
                             f"{tuple(self.total.shape)} {self.dtype} vectors")
        self.total.add_(vector, alpha=weight)
        self.weight += weight

    def mean(self) -> torch.Tensor:
        if self.total is None:
            raise ValueError("WeightedSum: nothing was added")
        return (self.total / self.weight).to(self.dtype)


def average_updates(updates: dict[int, Update], key: str = "model") -> torch.Tensor:
    """The sample-weighted mean of the updates' `key` vectors, summed in the updates' order (a
    WeightedSum): the same bits as the engine's running sums of a method with streamed_means."""
    if not updates:
        raise ValueError("average_updates: no updates")
    total = WeightedSum()
    for update in updates.values():
        total.add(update.tensors[key], update.n)
    return total.mean()

