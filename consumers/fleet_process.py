"""A stage's fleet in a child process of its own: the shape it is deployed in.

In one process, the stages' consumer loops and workers share one interpreter lock; under a
burst the busy stage then delays the other's dispatch and bookkeeping. A child process per
stage keeps them apart, with the same start, ready and graceful-stop semantics as `Fleet`.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.synchronize import Event

from consumers.fleet import Fleet, FleetSettings


def _serve(settings: FleetSettings, wait_assigned_s: float, ready: Event, stop: Event,
           parent: int) -> None:
    """Child side: run the fleet until the parent says stop or is gone (then stop gracefully).

    Ctrl-C is the parent's to handle: it stops the children in order.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    fleet = Fleet(settings)
    with fleet.running(wait_assigned_s=wait_assigned_s):
        ready.set()
        while not stop.wait(0.5) and os.getppid() == parent:
            fleet.raise_failures()


class FleetProcess:
    """Start a stage's fleet in a spawned child, wait until its group is settled, stop it."""

    def __init__(self, settings: FleetSettings) -> None:
        self.settings = settings
        context = multiprocessing.get_context("spawn")  # no fork of a process with client threads
        self._ready = context.Event()
        self._stop = context.Event()
        self._context = context

    @contextmanager
    def running(self, wait_assigned_s: float) -> Iterator[FleetProcess]:
        """`with fleet_process.running(s):` the fleet is assigned inside, stopped after."""
        stage = self.settings.member.stage
        process = self._context.Process(target=_serve, name=f"fleet-{stage}",
                                        args=(self.settings, wait_assigned_s, self._ready, self._stop,
                                              os.getpid()))
        process.start()
        try:
            deadline = time.monotonic() + wait_assigned_s + 30  # plus the child's start-up
            while not self._ready.wait(0.2):
                if not process.is_alive():
                    raise RuntimeError(f"fleet {stage} exited with code {process.exitcode} "
                                       "before its members were assigned (its log says why)")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"fleet {stage} not ready within {wait_assigned_s}s")
            yield self
        finally:
            self._stop.set()
            process.join(self.settings.shutdown_deadline_s + 20)
            if process.is_alive():
                process.kill()
                process.join()
                raise RuntimeError(f"fleet {stage} outlived its shutdown deadline and was killed")
            if process.exitcode:
                raise RuntimeError(f"fleet {stage} exited with code {process.exitcode}")
