"""A trainer that runs every work item in another process, as a Ray or Dask trainer would: the
items and the networks are pickled, trained by the sequential trainer in a worker process (one
spawned process, kept for the run), and the trained vectors come back pickled. Named in a spec as
`training.trainer: process_trainer:ProcessTrainer` (tests/ is on sys.path under pytest)."""

from __future__ import annotations

import multiprocessing
import pickle
from concurrent.futures import ProcessPoolExecutor

import torch

from cflpipe.fl.params import ParamSpace
from cflpipe.fl.plan import Trained, trained_into
from cflpipe.fl.trainers import SequentialTrainer, Trainer


def train_elsewhere(networks: bytes, items: bytes) -> bytes:
    """In the worker: rebuild each network's parameter space and train the items one by one."""
    torch.set_num_threads(1)
    spaces = {name: ParamSpace(module) for name, module in pickle.loads(networks).items()}
    trained = SequentialTrainer().train(spaces, pickle.loads(items))
    return pickle.dumps([(t.vector, t.result, t.companions) for t in trained])


class ProcessTrainer(Trainer):
    name = "process"
    pickled_items = 0  # every item this class sent across, for the tests

    def __init__(self) -> None:
        super().__init__()
        self.pool: ProcessPoolExecutor | None = None

    def train(self, spaces, items):
        if self.pool is None:
            self.pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        networks = pickle.dumps({name: spaces[name].model for name in {item.network for item in items}})
        payload = pickle.dumps(items)
        type(self).pickled_items += len(items)
        returned = pickle.loads(self.pool.submit(train_elsewhere, networks, payload).result())
        self.counts["sequential"] += len(items)
        # What stayed behind (`into`, the server's table) is written here, as in-process trainers do.
        return [Trained(trained_into(item, vector, result), result, companions)
                for item, (vector, result, companions) in zip(items, returned)]

    def __del__(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
