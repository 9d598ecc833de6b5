"""`trainer: distributed`: one run's clients spread over the processes `torchrun` starts, on one
machine or several (`torchrun --nnodes N --nproc_per_node K -m cflpipe train …`).

Rank 0 is the run: it samples, plans, aggregates, evaluates and writes, as in a single process.
Each round it cuts the work items into one contiguous shard per rank (by steps × batch size, as
the processes trainer does), trains its own shard and sends each other rank its shard over
torch.distributed (gloo), pickled with the networks (sent once per run to each rank). The other
ranks only train: each item by the sequential trainer's code, so a run's results are those of
`trainer: sequential`, bit for bit on machines with the same CPU kernels. Every client's trained
vector comes back to rank 0, not one all-reduced sum: clustered methods need each client's
upload, and the server's sums stay the single process's, in its order. CPU processes only; a
run's GPU is one process's (`batched`). Without torchrun (no WORLD_SIZE) it is the sequential
trainer in one process, so a spec that names it runs anywhere.
"""

from __future__ import annotations

import itertools
import os
import pickle
from datetime import timedelta

import torch

from cflpipe.fl.plan import Trained, trained_into
from cflpipe.fl.trainers import Trainer, _shards, portable_module, train_items

# A rank waits for rank 0 while it runs a round's server step and evaluation, which can take long
# at scale: a wait is not a failure, so the group's timeout is generous.
_TIMEOUT = timedelta(hours=24)
_STOP, _IDLE, _TRAIN = "stop", "idle", "train"
# Networks are sent to a rank once per (run, set of networks): a key for each, and what each rank
# last received, across the runs of one `cflpipe train` job (the ranks outlive each run's trainer).
_KEYS = itertools.count(1)
_SENT: dict[int, int] = {}


def launched() -> tuple[int, int]:
    """(rank, world size) as torchrun sets them; (0, 1) in a process it did not start."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def _join() -> None:
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo", timeout=_TIMEOUT)


class DistributedTrainer(Trainer):
    name = "distributed"

    def __init__(self) -> None:
        super().__init__()
        self.rank, self.world = launched()
        self.counts["on_other_ranks"] = 0  # of the items counted as sequential (timing.json)
        self._networks: dict[tuple[str, ...], tuple[int, bytes]] = {}

    def train(self, spaces, items):
        import torch.distributed as dist

        if not items:
            return []
        if self.world == 1:
            return [self.one(spaces, item) for item in items]
        _join()
        shards = _shards([item.steps * item.batch_size for item in items], self.world)
        names = tuple(sorted({item.network for item in items}))
        if names not in self._networks:
            self._networks[names] = (next(_KEYS), pickle.dumps({n: portable_module(spaces[n].model) for n in names}))
        key, networks = self._networks[names]
        threads = torch.get_num_threads()
        messages: list = [None]
        for rank, shard in enumerate(shards[1:], start=1):
            if not shard:
                messages.append((_IDLE,))
                continue
            messages.append((_TRAIN, key, None if _SENT.get(rank) == key else networks,
                             pickle.dumps([items[i] for i in shard]), threads))
            _SENT[rank] = key
        dist.scatter_object_list([None], messages, src=0)
        own = [self.one(spaces, items[i]) for i in shards[0]]
        replies: list = [None] * self.world
        dist.gather_object(None, replies, dst=0)
        results: list[Trained | None] = [None] * len(items)
        for i, trained in zip(shards[0], own):
            results[i] = trained
        self.counts["sequential"] -= len(own)  # self.one counted them; all are counted below
        for shard, reply in zip(shards[1:], replies[1:]):
            for i, (vector, result, companions) in zip(shard, pickle.loads(reply) if shard else []):
                # What stayed behind (`into`, a server table) is written here, as in-process trainers do.
                results[i] = Trained(trained_into(items[i], vector, result), result, companions)
        self.counts["sequential"] += len(items)
        self.counts["on_other_ranks"] += len(items) - len(own)
        return results  # type: ignore[return-value]


def serve() -> int:
    """A rank other than 0: train the shards rank 0 sends until it says stop."""
    import torch.distributed as dist

    from cflpipe.fl.params import ParamSpace

    _join()
    spaces, key = None, None
    while True:
        box: list = [None]
        dist.scatter_object_list(box, None, src=0)
        message = box[0]
        if message[0] == _STOP:
            break
        reply = None
        if message[0] == _TRAIN:
            _, sent_key, networks, items, threads = message
            if networks is not None:
                spaces, key = {n: ParamSpace(m) for n, m in pickle.loads(networks).items()}, sent_key
            assert key == sent_key, "rank 0 sent work for networks this rank never received"
            reply = train_items(spaces, items, threads)
        dist.gather_object(reply, None, dst=0)
    dist.destroy_process_group()
    return 0


def stop_workers() -> None:
    """Rank 0, when its job ends (whether or not a run used the ranks): let the others go."""
    import torch.distributed as dist

    rank, world = launched()
    if world == 1 or rank != 0:
        return
    _join()
    dist.scatter_object_list([None], [(_STOP,)] * world, src=0)
    dist.destroy_process_group()
    _SENT.clear()
