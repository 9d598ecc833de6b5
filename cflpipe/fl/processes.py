"""Client plans trained outside the run's process: the `processes` trainer (the sequential
trainer's own code in spawned CPU processes, one contiguous shard of a round's work items each)
and the pieces the `distributed` trainer (fl/distributed.py) and a plugin's worker share with it:
networks pickled as `portable_module`s, items trained by `train_items` / `train_pickled`, their
outcomes written back by `returned`, the work cut by `shard_indices`."""

from __future__ import annotations

import torch
from torch import nn

from cflpipe.fl.params import ParamSpace
from cflpipe.fl.plan import Trained, trained_into
from cflpipe.fl.trainers import SequentialTrainer, Trainer
from cflpipe.fl.work import WorkItem, pickled_together


def train_pickled(networks: bytes, items: bytes, threads: int) -> bytes:
    """In a worker process (of the processes trainer, or a plugin's): rebuild each network's
    parameter space from pickled `portable_module`s and train the pickled items one by one, as
    the sequential trainer does in the run's process; the outcomes come back pickled."""
    import pickle

    spaces = {name: ParamSpace(module) for name, module in pickle.loads(networks).items()}
    return train_items(spaces, items, threads)


def returned(item: WorkItem, outcome: tuple) -> Trained:
    """An item trained elsewhere, from train_items' (vector, result, companions): what stayed
    behind (`into`, a server table) is written here, as in-process trainers do."""
    vector, result, companions = outcome
    return Trained(trained_into(item, vector, result), result, companions)


def train_items(spaces: dict[str, ParamSpace], items: bytes, threads: int) -> bytes:
    """Pickled work items trained one by one on `spaces`, as the sequential trainer does in the
    run's process; the outcomes pickled (a worker of the processes or distributed trainer)."""
    import pickle

    torch.set_num_threads(threads)
    trained = SequentialTrainer().train(spaces, pickle.loads(items))
    return pickle.dumps([(t.vector, t.result, t.companions) for t in trained])


class ProcessesTrainer(Trainer):
    """The sequential trainer spread over `workers` processes of the CPU: a round's work items
    are cut into one contiguous shard per worker (by their steps × batch size), pickled with the
    networks, trained one by one in the workers (each with the run's torch threads) and sent back.
    An item is trained by the very code of the sequential trainer, so the results are its own,
    bit for bit on one machine. The workers start with the run's first round (spawned: a few
    seconds to import torch) and stay until it ends. For CPUs: models are applied in the run's
    process, as the sequential trainer does. The workers are spawned, so a script of one's own
    that trains with it needs the usual `if __name__ == "__main__":` guard (the `cflpipe`
    command has it)."""

    name = "processes"

    def __init__(self, workers: int) -> None:
        super().__init__()
        self.workers = workers
        self.pool = None
        self._networks: dict[tuple[str, ...], bytes] = {}  # pickled once a run: items carry the weights

    def train(self, spaces, items):
        import multiprocessing
        import pickle
        from concurrent.futures import ProcessPoolExecutor

        if not items:
            return []
        costs = [item.steps * item.batch_size for item in items]
        shards = [shard for shard in shard_indices(costs, self.workers) if shard]
        if len(shards) == 1:
            return [self.one(spaces, item) for item in items]
        if self.pool is None:
            self.pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"))
        names = tuple(sorted({item.network for item in items}))
        if names not in self._networks:
            self._networks[names] = pickle.dumps({name: portable_module(spaces[name].model) for name in names})
        networks = self._networks[names]
        threads = torch.get_num_threads()
        with pickled_together():
            shipped = [pickle.dumps([items[i] for i in shard]) for shard in shards]
        futures = [self.pool.submit(train_pickled, networks, payload, threads) for payload in shipped]
        results: list[Trained | None] = [None] * len(items)
        for shard, future in zip(shards, futures):
            for i, outcome in zip(shard, pickle.loads(future.result())):
                results[i] = returned(items[i], outcome)
        self.counts["sequential"] += len(items)
        return results  # type: ignore[return-value]

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None


def portable_module(module: nn.Module) -> nn.Module:
    """A copy whose parameters and buffers own their elements: a parameter space's are views of
    one flat vector, and pickling a view writes its whole storage (62 × 45 MB for ResNet-18)."""
    import copy

    clone = copy.deepcopy(module)
    with torch.no_grad():
        for tensor in (*clone.parameters(), *clone.buffers()):
            tensor.data = tensor.data.clone()
    return clone


def shard_indices(costs: list[int], parts: int) -> list[list[int]]:
    """Indices 0..n-1 cut into at most `parts` contiguous runs of about equal total cost."""
    total, shards, current, done = sum(costs), [[] for _ in range(parts)], 0, 0
    for i, cost in enumerate(costs):
        if current < parts - 1 and shards[current] and done >= total * (current + 1) / parts:
            current += 1
        shards[current].append(i)
        done += cost
    return shards
