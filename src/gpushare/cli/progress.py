"""Progress of `gpushare simulate` on a terminal: a bar counting the runs, and one bar per
run in progress (its policy and seed) counting the pods offered.

Runs in worker processes report through a queue that a thread of this process relays to
the bars, so every bar is drawn by one process. Off the terminal (tests, CI logs, a
redirect) no bar is drawn and no run reports anything.
"""

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from queue import Empty
from typing import Protocol, TextIO

from tqdm import tqdm

from gpushare.simulator.run import Progress

Sink = Callable[[str, int, int, int], None]
"""Takes (policy label, seed, pods offered, pods that will arrive)."""

STEPS = 100
"""Reports per run at most: enough for a smooth bar, few enough to cost nothing."""


class RunBars:
    """The bars: `advance` may come from a relay thread, `finished` from the main one."""

    def __init__(self, runs: int, file: TextIO, disable: bool | None = None) -> None:
        # disable=None: tqdm draws only when `file` is a terminal.
        self._file = file
        self._runs = tqdm(total=runs, desc="runs", unit="run", file=file, disable=disable)
        self._bars: dict[tuple[str, int], tqdm] = {}
        self._done: set[tuple[str, int]] = set()
        self._lock = threading.Lock()

    @property
    def shown(self) -> bool:
        return not self._runs.disable

    def advance(self, policy: str, seed: int, offered: int, total: int) -> None:
        key = (policy, seed)
        with self._lock:
            if key in self._done:  # a report that came after the run's result
                return
            bar = self._bars.get(key)
            if bar is None:
                bar = self._bars[key] = tqdm(
                    total=total,
                    desc=f"{policy} seed {seed}",
                    unit="pod",
                    file=self._file,
                    leave=False,
                    disable=not self.shown,
                )
            bar.update(offered - bar.n)

    def finished(self, policy: str, seed: int) -> None:
        with self._lock:
            self._done.add((policy, seed))
            bar = self._bars.pop((policy, seed), None)
            if bar is not None:
                bar.close()
            self._runs.set_postfix_str(f"last: {policy} seed {seed}")
            self._runs.update()

    def close(self) -> None:
        with self._lock:
            for bar in self._bars.values():
                bar.close()
            self._runs.close()


def throttled(sink: Sink, policy: str, seed: int) -> Progress:
    """A run's progress callback that passes on about STEPS reports and the last one."""

    def report(offered: int, total: int) -> None:
        if offered == total or offered % max(1, total // STEPS) == 0:
            sink(policy, seed, offered, total)

    return report


class _Queue(Protocol):
    def get(self, block: bool = True, timeout: float | None = None) -> tuple[str, int, int, int]:
        """What a worker's sink put."""


@contextmanager
def relayed(queue: _Queue, bars: RunBars) -> Iterator[None]:
    """Moves the workers' reports from the queue to the bars until the block ends, then
    what is left in the queue."""
    stop = threading.Event()

    def relay() -> None:
        while True:
            try:
                bars.advance(*queue.get(timeout=0.1))
            except Empty:
                if stop.is_set():
                    return

    thread = threading.Thread(target=relay, name="progress-relay", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
