"""Trainers execute client plans. `sequential` trains one client after the other on the run's
flat parameter space (the reference, bit for bit what cflpipe always did); `batched` trains every
plan of a round that shares its settings at once with torch.func (functional_call + grad + vmap
over a (clients × P) matrix of flat vectors), drawing each client's batches from the same seeded
generator the sequential trainer uses, so the two agree to float rounding.

Plans are grouped by what must be equal inside one vmapped loop: network, batch size, lr,
momentum, weight decay, loss, step rule, anchor strengths and masks, trainable mask, companions.
Step counts may differ within a group by up to 2× (local_epochs over clients of unequal size): a
client with fewer steps has the group's extra steps undone (run_loop's `active`), so a round is
a few vmapped loops rather than one per distinct step count. A group larger than the memory
budget (GROUP_MEMORY_BUDGET) is trained in chunks of clients.
A group of one or a client without data is trained sequentially as a matter of course; a group
the batched path fails on (a loss that is not vmappable, say) is trained sequentially too, and the
first such failure of a run is said once on stderr. timing.json counts the plans each path trained."""

from __future__ import annotations

import sys
from collections import defaultdict
from typing import Any, Callable, Iterator

import numpy as np
import torch

from torch import nn

from cflpipe.errors import CompileError
from cflpipe.fl.local import LocalResult, batch_indices, precision_scope, run_loop, sgd, step_config
from cflpipe.fl.params import ParamSpace
from cflpipe.fl.plan import Trained, trained_into
from cflpipe.fl.work import WorkItem
from cflpipe.seeds import mix_seed  # noqa: F401  (its old home; plugins import it from here)

# Bytes a batched group may take, by device type; a CUDA device's share of its total memory.
# A client costs about BYTES_PER_PARAMETER per model parameter in a vmapped loop (its weights,
# per-tensor and flat gradients, velocity, anchors and the activations of a typical batch: a
# rough figure, so that hundreds of ResNet-sized clients are trained in chunks, never at once).
GROUP_MEMORY_BUDGET = {"cpu": 2 << 30}
CUDA_MEMORY_SHARE = 0.5
BYTES_PER_PARAMETER = 32
# The most steps a group's longest client may take per step of its shortest: the work undone
# for shorter clients stays below the work done.
STEP_SPREAD = 2.0


Inputs = tuple[torch.Tensor, ...]


class Applied(nn.Module):
    """Calls one method of a module (forward, features, inverse…) as its forward, so that
    torch.func.functional_call can apply that method with other parameters."""

    def __init__(self, module: nn.Module, call: str):
        super().__init__()
        self.module, self.call = module, call

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return getattr(self.module, self.call)(*args)


class Trainer:
    """Trains work items (fl/work.py) on the networks of `spaces` and applies parameter vectors
    to inputs. A trainer never sees the run's Context: what it trains is in the items."""

    name = "trainer"

    def __init__(self) -> None:
        self.counts = {"sequential": 0, "batched": 0}

    def train(self, spaces: dict[str, ParamSpace], items: list[WorkItem]) -> list[Trained]:
        raise NotImplementedError

    def train_each(self, spaces: dict[str, ParamSpace], items: list[WorkItem]) -> Iterator[Trained]:
        """The items' results in order, each as soon as the trainer has it (default: all of
        train's at once)."""
        yield from self.train(spaces, items)

    def close(self) -> None:
        """Let go of what the trainer holds for the run (worker processes); called when it ends."""

    def state_dict(self) -> dict:
        """What a resumed run's trainer must know to train as before (auto's choices)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Take back state_dict's contents from a checkpoint."""

    def took_measurement(self) -> bool:
        """Whether the trainer timed work of its own since it was last asked, so that the round
        cost more than its training (auto's first meeting with a shape)."""
        return False

    def one(self, spaces: dict[str, ParamSpace], item: WorkItem) -> Trained:
        """Train one item on its network's flat parameter space."""
        self.counts["sequential"] += 1
        space = spaces[item.network]
        space.load(item.start)
        companions = {k: v.detach().clone() for k, v in item.companions.items()}
        result = sgd(space, item.x, item.y, steps=item.steps, batch_size=item.batch_size, lr=item.lr,
                     generator=item.generator(), momentum=item.momentum, weight_decay=item.weight_decay,
                     anchors=item.anchors, trainable=item.trainable, loss=item.loss, rule=item.rule,
                     companions=companions, precision=item.precision)
        vector = space.flat.detach() if item.into is not None and not result.diverged else space.read()
        return Trained(trained_into(item, vector, result), result, companions)

    # ------------------------------------------------------------------ applying models

    def apply(self, network: ParamSpace, vectors: torch.Tensor | list[torch.Tensor],
              inputs: Inputs | list[Inputs], call: str = "forward", chunk: int | None = None
              ) -> torch.Tensor | list[torch.Tensor]:
        """Apply each parameter vector (rows of `vectors`, of the parameter space `network`) to inputs,
        without gradients, in evaluation mode: `module.<call>(*inputs)` in chunks of `chunk` rows
        (None: all at once). `inputs` is one tuple of tensors every vector is applied to (the
        result is one (vectors × rows × …) tensor), or a list of one tuple per vector, of any
        lengths (the result is a list). The sequential path loads one vector after the other into
        the space; the batched trainer overrides this with vmap over the vectors."""
        return self.apply_one_by_one(network, vectors, inputs, call, chunk)

    @staticmethod
    @torch.no_grad()
    def apply_one_by_one(params: ParamSpace, vectors, inputs, call: str, chunk: int | None):
        function = getattr(params.model, call)
        params.model.eval()
        shared = isinstance(inputs, tuple)
        outputs = []
        for j, vector in enumerate(vectors):
            params.load(vector)
            args = inputs if shared else inputs[j]
            rows = args[0].shape[0]
            step = chunk or max(rows, 1)
            outputs.append(torch.cat([function(*(a[i:i + step] for a in args)) for i in range(0, max(rows, 1), step)]))
        return torch.stack(outputs) if shared else outputs


class SequentialTrainer(Trainer):
    name = "sequential"

    def train(self, spaces, items):
        return [self.one(spaces, item) for item in items]

    def train_each(self, spaces, items):
        if type(self).train is not SequentialTrainer.train:  # a subclass's own train is what trains
            yield from self.train(spaces, items)
            return
        for item in items:
            yield self.one(spaces, item)


# training.compile: distinct compiled graphs of the batched step one process may hold (TorchDynamo
# counts them per code object, so every group shape, network and loss of every run in the process
# adds to it). Past it TorchDynamo would silently run the step uncompiled, which would change a
# run's bits with what the process ran before: it is an error instead.
COMPILE_LIMIT = 128


class BatchedTrainer(Trainer):
    """Trains a round's work items in groups, each group one vmapped loop over its clients.
    `compiled`: the vmapped step goes through torch.compile (training.compile), specialised to
    each group's shapes (dynamic=False): a group of a given shape gets the same kernels whatever
    the process compiled before, so reruns and resumed runs keep their bits. TorchDynamo keeps
    the compiled graphs for the process, so each distinct shape compiles once per process."""

    name = "batched"

    def __init__(self, compiled: bool = False) -> None:
        super().__init__()
        self.fallback_said = False
        self.compiled = compiled

    @staticmethod
    def group_key(item: WorkItem) -> tuple | None:
        n = len(item.y)
        if n == 0 or item.steps == 0:
            return None
        # Objects that must be the same in a group are keyed by identity: masks are shared
        # tensors (ParamSpace.body/head), losses and rules module-level or frozen dataclasses.
        anchors = tuple((float(a.strength), None if a.mask is None else id(a.mask)) for a in item.anchors)
        return (item.network, min(item.batch_size, n), (item.lr, item.momentum, item.weight_decay),
                item.rule, id(item.loss), anchors, None if item.trainable is None else id(item.trainable),
                tuple(sorted(item.companions)), item.source is not None, item.dropout_seed is not None,
                item.precision)

    def train(self, spaces, items):
        results: list[Trained | None] = [None] * len(items)
        groups: dict[Any, list[int]] = defaultdict(list)
        for i, item in enumerate(items):
            key = self.group_key(item)
            groups[("alone", i) if key is None else key].append(i)
        chunks = [chunk for members in groups.values() for bucket in self.step_buckets(items, members)
                  for chunk in self.memory_chunks(spaces, items, bucket)]
        for members in chunks:
            if len(members) > 1:
                try:
                    trained = self.group(spaces, [items[i] for i in members])
                except CompileError:
                    raise  # training.compile was asked for: never train uncompiled instead
                except Exception as exc:  # noqa: BLE001 - any failure of vmap: train these plans one by one
                    self.say_fallback(exc)
                else:
                    for i, t in zip(members, trained):
                        results[i] = t
                    continue
            for i in members:
                results[i] = self.one(spaces, items[i])
        return results  # type: ignore[return-value]

    @staticmethod
    def step_buckets(items: list[WorkItem], members: list[int]) -> list[list[int]]:
        """Members split by step count into buckets whose longest is at most STEP_SPREAD times
        their shortest (in the members' order within each)."""
        buckets: list[list[int]] = []
        shortest = None
        for i in sorted(members, key=lambda i: items[i].steps):
            if shortest is None or items[i].steps > STEP_SPREAD * shortest:
                buckets.append([])
                shortest = items[i].steps
            buckets[-1].append(i)
        return [sorted(bucket) for bucket in buckets]

    @staticmethod
    def memory_chunks(spaces: dict[str, ParamSpace], items: list[WorkItem], members: list[int]) -> list[list[int]]:
        """Members in chunks that fit the device's GROUP_MEMORY_BUDGET."""
        flat = spaces[items[members[0]].network].flat
        if flat.device.type == "cuda":
            budget = CUDA_MEMORY_SHARE * torch.cuda.get_device_properties(flat.device).total_memory
        else:
            budget = GROUP_MEMORY_BUDGET.get(flat.device.type, GROUP_MEMORY_BUDGET["cpu"])
        size = max(1, int(budget // (flat.numel() * BYTES_PER_PARAMETER)))
        return [members[i:i + size] for i in range(0, len(members), size)]

    def say_fallback(self, exc: Exception, what: str = "run some client plans", instead: str = "training them") -> None:
        if not self.fallback_said:
            self.fallback_said = True
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            print(f"cflpipe: the batched trainer cannot {what} ({type(exc).__name__}: {reason}); "
                  f"{instead} sequentially", file=sys.stderr)

    def apply(self, network, vectors, inputs, call="forward", chunk=None):
        """On a GPU, vmap(functional_call) over the stacked vectors (the torch.func
        model-ensembling pattern): one batched call per chunk of rows instead of one per vector
        (apply_batched). On a CPU one by one, which `cflpipe bench --part apply` measured as fast
        or faster (the mlp 0.46–0.51×, the cnn 0.38–0.59× batched against one by one for one
        evaluation of IFCA with K = 4 and of Ditto at 100 clients): a CPU has no kernel launches
        for the batching to save, and vmapped convolutions run slower."""
        device = vectors.device if isinstance(vectors, torch.Tensor) else vectors[0].device
        if len(vectors) < 2 or device.type != "cuda":
            return self.apply_one_by_one(network, vectors, inputs, call, chunk)
        try:
            return self.apply_batched(network, vectors, inputs, call, chunk)
        except Exception as exc:  # noqa: BLE001 - any failure of vmap: apply one by one
            self.say_fallback(exc, "apply some models", "applying them")
        return self.apply_one_by_one(network, vectors, inputs, call, chunk)

    @staticmethod
    @torch.no_grad()
    def apply_batched(params: ParamSpace, vectors, inputs, call, chunk):
        """apply() as one vmap over the stacked vectors; inputs of different lengths per vector
        are padded to the longest (padding rows are dropped from the results). Equal to the
        sequential path to float rounding."""
        from torch.func import functional_call, vmap

        stacked = vectors if isinstance(vectors, torch.Tensor) else torch.stack(list(vectors))
        weights = {f"module.{s.name}": stacked[:, s.offset:s.offset + s.numel].view(len(stacked), *s.shape)
                   for s in params.slots}
        applied = Applied(params.model, call)
        params.model.eval()
        shared = isinstance(inputs, tuple)
        if shared:
            # Shared inputs are mapped over as (expanded, uncopied) per-vector inputs: networks
            # that fill a fresh tensor in place from them (zuko's couplings) need their inputs
            # batched whenever their parameters are.
            args, lengths = tuple(a.expand(len(stacked), *a.shape) for a in inputs), None
        else:  # pad every vector's inputs to the longest: one (vectors × rows × …) tensor per argument
            lengths = [int(a[0].shape[0]) for a in inputs]
            longest = max(lengths)
            args = tuple(torch.stack([torch.cat([a[k], a[k].new_zeros((longest - len(a[k]), *a[k].shape[1:]))])
                                      for a in inputs]) for k in range(len(inputs[0])))
        rows = args[0].shape[1]
        mapped = vmap(lambda w, *a: functional_call(applied, w, a))
        step = chunk or max(rows, 1)
        pieces = [mapped(weights, *(a[:, i:i + step] for a in args)) for i in range(0, max(rows, 1), step)]
        out = torch.cat(pieces, dim=1)
        return out if shared else [out[j, :n] for j, n in enumerate(lengths)]

    @staticmethod
    def gradient_function(space: ParamSpace, loss, dropout: bool, precision: str = "float32"):
        """(C × P) rows, (C × B …) inputs and labels -> (each row's loss, its (C × P) gradient),
        one vmap over the rows. The gradient is taken with respect to each parameter tensor (a
        (C × …) view of the rows' columns) and written into the (C × P) matrix by one cat: taken
        with respect to the rows themselves, the backward of every slice would add into a zero
        (C × P) tensor of its own, one per parameter tensor per step (3.4× slower a step on a
        582k-parameter CNN, #32)."""
        from torch.func import functional_call, grad_and_value, vmap

        model, slots = space.model, space.slots

        def tensor_loss(params: dict[str, torch.Tensor], xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
            return loss(lambda *args: functional_call(model, params, args), xb, yb)

        batched = vmap(grad_and_value(tensor_loss), randomness="different" if dropout else "error")

        def gradient(w: torch.Tensor, xb: torch.Tensor, yb: torch.Tensor):
            clients = len(w)
            views = {s.name: w[:, s.offset:s.offset + s.numel].view(clients, *s.shape) for s in slots}
            with precision_scope(precision, w.device.type):
                grads, values = batched(views, xb, yb)
            return values.detach(), torch.cat([grads[s.name].reshape(clients, -1) for s in slots], dim=1)

        return gradient

    def group(self, spaces: dict[str, ParamSpace], items: list[WorkItem]) -> list[Trained]:
        first = items[0]
        space = spaces[first.network]
        model = space.model
        streams = [item.generator() for item in items]
        steps, per_step = max(item.steps for item in items), first.rule.batches_per_step
        batch = min(first.batch_size, len(first.y))
        # Rows of every client's batches in one concatenation of the group's data: for the
        # clients' own rows that is the split itself (no copy), indexed at the clients' offsets.
        if first.source is not None and all(item.source[0] is first.source[0] for item in items):
            x_all, y_all, _ = first.source
            offsets = [item.source[2] for item in items]
        else:
            sizes = np.cumsum([0] + [len(item.y) for item in items])
            offsets = sizes[:-1].tolist()
            x_all, y_all = torch.cat([item.x for item in items]), torch.cat([item.y for item in items])
        # A client with fewer steps than the group repeats its last batch in the steps it undoes.
        rows = torch.stack([_padded(batch_indices(len(item.y), first.batch_size, item.steps * per_step, g),
                                    steps * per_step) + offset
                            for item, g, offset in zip(items, streams, offsets)])  # (C × steps·k × B)
        rows = rows.view(len(items), steps, per_step, batch).permute(1, 2, 0, 3).to(y_all.device)
        own_steps = torch.tensor([item.steps for item in items], device=y_all.device)
        active = None if bool((own_steps == steps).all()) else \
            torch.arange(steps, device=y_all.device)[:, None] < own_steps[None, :]  # (steps × C)

        weights = torch.stack([item.start for item in items]).to(space.flat.dtype)
        companions = {k: torch.stack([item.companions[k] for item in items]) for k in first.companions}
        anchors = [type(a)(torch.stack([item.anchors[j].vector for item in items]), a.strength, a.mask)
                   for j, a in enumerate(first.anchors)]
        config = step_config(weights, first.lr, first.momentum, first.weight_decay, anchors, first.trainable)
        gradient = self.gradient_function(space, first.loss, first.dropout_seed is not None, first.precision)
        if self.compiled:
            gradient = compiled_step(gradient)
        total = torch.zeros(len(items), dtype=weights.dtype, device=weights.device)
        model.train()
        run_loop(weights, rows, lambda b: (x_all[b], y_all[b]), gradient, first.rule, config, companions, total,
                 active)
        losses = total.cpu().tolist()
        self.counts["batched"] += len(items)
        results = [LocalResult(losses[i] / item.steps, item.steps, item.steps * per_step * batch)
                   for i, item in enumerate(items)]
        return [Trained(trained_into(item, weights[i], result), result, {k: v[i] for k, v in companions.items()})
                for i, (item, result) in enumerate(zip(items, results))]


def compiled_step(gradient: Callable) -> Callable:
    """`gradient` through torch.compile, specialised to each shape; a failure to compile (no C++
    compiler or Triton, a backend error, more than COMPILE_LIMIT graphs) is a CompileError."""
    import torch._dynamo
    from torch._dynamo.exc import BackendCompilerFailed, FailOnRecompileLimitHit
    from torch._inductor.exc import InductorError

    compiled = torch.compile(gradient, dynamic=False)

    def step(*args: torch.Tensor):
        try:
            with torch._dynamo.config.patch(recompile_limit=COMPILE_LIMIT, fail_on_recompile_limit_hit=True):
                return compiled(*args)
        except (BackendCompilerFailed, InductorError, FailOnRecompileLimitHit) as exc:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise CompileError(f"training.compile: torch.compile failed on the batched step ({type(exc).__name__}: "
                               f"{reason[:200]}); allowed: compile: false, or a machine with a C++ compiler "
                               f"(CPU) or Triton (CUDA)") from exc

    return step


def _padded(rows: torch.Tensor, length: int) -> torch.Tensor:
    """(steps × B) index batches extended to `length` rows by repeating the last one."""
    if len(rows) == length:
        return rows
    return torch.cat([rows, rows[-1:].expand(length - len(rows), -1)])
