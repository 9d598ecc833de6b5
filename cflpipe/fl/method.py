"""The method interface the engine drives (after Flower's Strategy and ClientApp: the server
configures a round, each client's local work is a plan the engine's trainer executes, the server
aggregates). A method never loops over rounds or local steps itself and never touches the
engine's internals; what differs between methods is data: which anchors pull the local
objective, which parameters are shared, which loss and step rule, how many models travel down.

The contract is three files: the messages (fl/messages.py: Payload, Update, Placement,
ClientView), the context (fl/context.py: Context, ClientStore) and this one (Method, and the
engine's calls into it)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from cflpipe.fl import rowfile
from cflpipe.fl.plan import Plans, Results
from cflpipe.fl.rowfile import copy_rows
from cflpipe.fl.predictors import Models, Predictor
from cflpipe.registry import Capabilities, bind_declared

# The messages and the context live in their own files (fl/messages.py, fl/context.py); their
# names stay importable from here, where plugins and the methods have always found them.
from cflpipe.fl.context import ClientStore, Context, divergence_error  # noqa: E402,F401
from cflpipe.fl.messages import (NOT_TRAINED, ROUND, SERVE, ClientView, Payload, Placement, Update,  # noqa: E402,F401
                                 WeightedSum, average_updates, round_lr, stack_updates, take_rows)


# Hooks whose override makes a class's clients or models its own: an inherited rule for new
# clients (Method.place) then no longer applies.
_WHAT_A_RULE_READS = ("client_plan", "client_finish", "predictor", "cluster_models", "cluster_client_finish")
# The server-object client hooks of before the one client form (#45, removed 2026-11-28); a class
# defining one is refused.
_REMOVED_CLIENT_HOOKS = ("plan", "finish", "start_client", "end_client", "local_update", "anchors", "cluster_finish")
# Hooks of before #45 (removed 2026-11-28) that became the engine's (receive, streams_means) or the registration's
# (clustering_starts, premises: register(..., starts=, premises=)).
_REMOVED_HOOKS = {"receive": "the engine passes the round's updates to aggregate(updates) (or aggregate_means)",
                  "streams_means": "declare streamed_means; the engine sums uploads for a class that does",
                  "clustering_starts": "pass starts=(hp -> (key, round) | None) to register()",
                  "premises": "pass premises=(hp, training, scenario -> [(key, text)]) to register()"}
# The evaluation hooks of before the one evaluation shape (#45, removed 2026-11-28), all replaced by predictor().
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
    # Client-state tables (ctx.clients) a new client keeps from one placement to the next, where
    # the method's own rule carries them (the mixtures' π: their authors' code updates an unseen
    # client's weights once per evaluation from the last ones); every other table starts at its
    # default at each placement. Checkpointed with the run.
    newcomer_keeps: tuple[str, ...] = ()

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
                held = getattr(self, name, None)
                if isinstance(held, torch.Tensor) and rowfile.owner(held) is not None:
                    copy_rows(held, value)  # a table on disk (Context.table) stays its file
                    continue
                value = value.to(self.ctx.device)
            setattr(self, name, value)
