"""`trainer: distributed`: one run's clients spread over the CPU processes `torchrun` starts
(`torchrun --nproc_per_node K -m cflpipe train …`; on several machines with torchrun's
`--nnodes` and a rendezvous, untested here).

Rank 0 is the job: it runs every run as a single process would (sampling, plans, aggregation,
evaluation, writing). Each round it cuts the work items into one contiguous shard per rank (by
steps × batch size, as the processes trainer does), sends each other rank its shard over
torch.distributed (gloo; the items pickled, the networks once per run and rank), trains its own
shard and receives the others' trained vectors. The other ranks only train, each item by the
sequential trainer's code, so a run's results are `trainer: sequential`'s, bit for bit where every
rank has the same CPU kernels (one machine, or nodes of one instruction set). Every client's
trained vector comes back to rank 0, not one all-reduced sum: clustered methods need each upload,
and the server's sums stay the single process's, in its order. CPU processes only; a run's GPU
is one process's (`batched`). Without torchrun (no WORLD_SIZE) it is the sequential trainer in one
process, said once on stderr.

On several machines: results_dir and data_dir on a file system every node sees (rank 0 may land
on any node), cflpipe and any plugins installed on every node (items are unpickled there), and
GLOO_SOCKET_IFNAME where a node has several networks.
"""

from __future__ import annotations

import itertools
import os
import pickle
import sys
from datetime import timedelta

import torch

from cflpipe.fl.plan import Trained
from cflpipe.fl.processes import portable_module, returned, shard_indices, train_items
from cflpipe.fl.trainers import Trainer
from cflpipe.fl.work import pickled_together

# A rank waits for rank 0 while it runs a round's server step and evaluation, or runs that do
# not use the ranks: a long wait is not a failure (a rank that dies ends the job through torchrun).
_TIMEOUT = timedelta(days=30)
_STOP, _TRAIN = 0, 1
# Networks are sent to a rank once per (run, set of networks): a key for each, and what each rank
# last received, across the runs of one `cflpipe train` job (the ranks outlive each run's trainer).
_KEYS = itertools.count(1)
_SENT: dict[int, int] = {}
_JOB = {"used": False, "alone_said": False}


def launched() -> tuple[int, int]:
    """(rank, world size) as torchrun sets them; (0, 1) in a process it did not start."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def join() -> None:
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo", timeout=_TIMEOUT)


def _send(payload: bytes, to: int) -> None:
    import torch.distributed as dist

    dist.send(torch.tensor([len(payload)], dtype=torch.int64), to)
    if payload:
        dist.send(torch.frombuffer(bytearray(payload), dtype=torch.uint8), to)


def _receive(source: int) -> bytes:
    import torch.distributed as dist

    size = torch.zeros(1, dtype=torch.int64)
    dist.recv(size, source)
    if not int(size):
        return b""
    data = torch.empty(int(size), dtype=torch.uint8)
    dist.recv(data, source)
    return data.numpy().tobytes()


class DistributedTrainer(Trainer):
    name = "distributed"

    def __init__(self) -> None:
        super().__init__()
        self.rank, self.world = launched()
        self.counts["on_other_ranks"] = 0  # of the items counted as sequential (timing.json)
        self._networks: dict[tuple[str, ...], tuple[int, bytes]] = {}
        if self.world == 1 and not _JOB["alone_said"]:
            _JOB["alone_said"] = True
            print("cflpipe: trainer distributed without torchrun (WORLD_SIZE unset): training in this process "
                  "only, as trainer sequential", file=sys.stderr)

    def train(self, spaces, items):
        if not items:
            return []
        if self.world == 1:
            return [self.one(spaces, item) for item in items]
        join()
        _JOB["used"] = True
        shards = shard_indices([item.steps * item.batch_size for item in items], self.world)
        names = tuple(sorted({item.network for item in items}))
        if names not in self._networks:
            self._networks[names] = (next(_KEYS), pickle.dumps({n: portable_module(spaces[n].model) for n in names}))
        key, networks = self._networks[names]
        threads = torch.get_num_threads()
        busy = [rank for rank in range(1, self.world) if shards[rank]]
        payloads = {}  # every shard pickled before any is sent: a failure here leaves no rank busy
        for rank in busy:
            with pickled_together():
                shard = pickle.dumps([items[i] for i in shards[rank]])
            fresh = _SENT.get(rank) != key
            payloads[rank] = pickle.dumps((_TRAIN, key, networks if fresh else None, shard, threads))
        # The other ranks train meanwhile. Every rank sent work is heard whatever happens here (a
        # gloo send waits for its receiver, so an unread reply would block that rank's next
        # message, and a later round would read it as its own).
        sent, raw = [], {}
        try:
            for rank in busy:
                _send(payloads[rank], rank)
                sent.append(rank)
                _SENT[rank] = key
            own = [self.one(spaces, items[i]) for i in shards[0]]
        finally:
            for rank in sent:
                raw[rank] = _receive(rank)
        replies = {rank: pickle.loads(raw[rank]) for rank in busy}
        results: list[Trained | None] = [None] * len(items)
        for i, trained in zip(shards[0], own):
            results[i] = trained
        for rank in busy:
            if isinstance(replies[rank], str):
                raise RuntimeError(f"rank {rank} failed to train its clients: {replies[rank]}")
            for i, outcome in zip(shards[rank], replies[rank]):
                results[i] = returned(items[i], outcome)
        self.counts["sequential"] += len(items) - len(own)  # self.one counted rank 0's own
        self.counts["on_other_ranks"] += len(items) - len(own)
        return results  # type: ignore[return-value]


def serve() -> int:
    """A rank other than 0: train the shards rank 0 sends until it says stop. A failure in one
    shard is sent back as its message (rank 0 raises it), so no rank is left waiting."""
    import torch.distributed as dist

    from cflpipe.fl.params import ParamSpace

    join()
    spaces, key = None, None
    while True:
        message = pickle.loads(_receive(0))
        if message[0] == _STOP:
            break
        _, sent_key, networks, items, threads = message
        try:
            if networks is not None:
                spaces, key = {n: ParamSpace(m) for n, m in pickle.loads(networks).items()}, sent_key
            if key != sent_key:
                raise RuntimeError(f"work for networks {sent_key}, but this rank holds networks {key}")
            reply = train_items(spaces, items, threads)  # already pickled: sent as it is
        except Exception as exc:  # noqa: BLE001 - reported to rank 0, which raises it
            reply = pickle.dumps(f"{type(exc).__name__}: {exc}".splitlines()[0])
        _send(reply, 0)
    dist.destroy_process_group()
    return 0


def start_job() -> None:
    """Rank 0 at the start of a `cflpipe train` job under torchrun: join the other ranks, which
    joined when they started, so none waits on a group that rank 0 might never form."""
    if launched()[1] > 1:
        join()


def stop_workers() -> None:
    """Rank 0 when its job ends, whether or not a run used the ranks: let the others go."""
    import torch.distributed as dist

    rank, world = launched()
    if world == 1 or rank != 0:
        return
    join()
    for other in range(1, world):
        _send(pickle.dumps((_STOP,)), other)
    dist.destroy_process_group()
    _SENT.clear()
    if not _JOB["used"]:
        idle = "rank 1" if world == 2 else f"ranks 1 to {world - 1}"
        print(f"cflpipe: torchrun started {world} ranks, but no run of this job used trainer: distributed; "
              f"{idle} stayed idle", file=sys.stderr)
