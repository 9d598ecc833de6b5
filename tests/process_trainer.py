"""A trainer that runs every work item in another process, as a Ray or Dask trainer would: the
items and the networks are pickled, trained by the sequential trainer in a worker process (one
spawned process, kept for the run), and the trained vectors come back pickled. Named in a spec as
`training.trainer: process_trainer:ProcessTrainer` (tests/ is on sys.path under pytest)."""

from __future__ import annotations

import multiprocessing
import pickle
from concurrent.futures import ProcessPoolExecutor


from cflpipe.fl.plan import Trained, trained_into
from cflpipe.fl.processes import portable_module, train_pickled
from cflpipe.fl.trainers import Trainer


class ProcessTrainer(Trainer):
    name = "process"
    pickled_items = 0  # every item this class sent across, for the tests

    def __init__(self) -> None:
        super().__init__()
        self.pool: ProcessPoolExecutor | None = None

    def train(self, spaces, items):
        if self.pool is None:
            self.pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        names = {item.network for item in items}
        networks = pickle.dumps({name: portable_module(spaces[name].model) for name in names})
        payload = pickle.dumps(items)
        type(self).pickled_items += len(items)
        returned = pickle.loads(self.pool.submit(train_pickled, networks, payload, 1).result())
        self.counts["sequential"] += len(items)
        # What stayed behind (`into`, the server's table) is written here, as in-process trainers do.
        return [Trained(trained_into(item, vector, result), result, companions)
                for item, (vector, result, companions) in zip(items, returned)]

    def __del__(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
