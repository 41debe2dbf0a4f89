"""Host worker threads for eager attention on host tensors.

Why threads of our own instead of torch's intra-op pool: the kernel is a stream
of many small ops (gather a chunk, one matmul, ...). With intra-op parallelism
every op ends in a barrier of all threads, so the threads run in lock step —
all gathering (memory bound) or all multiplying (compute bound) at once — and
on a shared machine one descheduled thread stalls every op for a scheduler
time slice. Independent pieces of work (groups of rows) on worker threads with
one intra-op thread each overlap memory and compute phases and never wait on
each other. Torch releases the GIL inside ops, so Python threads run them in
parallel.

Only for ops that execute on the calling thread (host tensors): device ops are
queued on the caller's stream, which a worker thread would not share, and a
graph records only the capturing thread.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import torch

__all__ = ["HostWorkers", "host_workers"]


class HostWorkers:
    """``count`` Python threads, each limited to one intra-op torch thread."""

    def __init__(self, count: int) -> None:
        self.count = count
        ready = threading.Barrier(count + 1)
        self._pool = ThreadPoolExecutor(count, thread_name_prefix="attnhal-torch",
                                        initializer=self._init, initargs=(ready,))
        saved = torch.get_num_threads()
        for _ in range(count):
            self._pool.submit(lambda: None)
        ready.wait()
        # set_num_threads in a worker also changes the count new threads start
        # with; restore it for the rest of the process (workers keep theirs).
        torch.set_num_threads(saved)

    @staticmethod
    def _init(ready: threading.Barrier) -> None:
        torch.set_num_threads(1)
        ready.wait()

    def run(self, tasks: Sequence[Callable[[], None]]) -> None:
        """Run ``tasks`` on the workers and wait for all; re-raises the first error."""
        for future in [self._pool.submit(task) for task in tasks]:
            future.result()


_shared: dict[tuple[int, int], HostWorkers] = {}
_lock = threading.Lock()


def host_workers(count: int) -> HostWorkers:
    """The process-wide pool of ``count`` workers (created on first use, shared by backends).

    Keyed by process id too: a forked child inherits the pool object but not its
    threads, and would wait forever on it.
    """
    key = (os.getpid(), count)
    with _lock:
        workers = _shared.get(key)
        if workers is None:
            workers = _shared[key] = HostWorkers(count)
        return workers
