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

from consumers.runtime import start_up_heap
from consumers.runtime.fleet import Fleet
from consumers.runtime.fleet_settings import FleetSettings


def _serve(settings: FleetSettings, ready: Event, stop: Event, parent: int) -> None:
    """Child side: run the fleet until the parent says stop or is gone (then stop gracefully).

    Ctrl-C is the parent's to handle: it stops the children in order.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    fleet = Fleet(settings)
    start_up_heap.freeze()
    with fleet.running():
        fleet.wait_assigned()
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
        self._process: multiprocessing.process.BaseProcess | None = None
        self._killed = False

    @contextmanager
    def running(self) -> Iterator[FleetProcess]:
        """`with fleet_process.running():` the child runs inside (`wait_assigned` waits until
        its group is settled) and is stopped after."""
        stage = self.settings.member.stage
        self._process = self._context.Process(target=_serve, name=f"fleet-{stage}",
                                              args=(self.settings, self._ready, self._stop, os.getpid()))
        self._process.start()
        try:
            yield self
        finally:
            if not self._killed:  # a killed child may leave its stop event locked: not set then
                self._stop_child(self._process, stage)

    def _stop_child(self, process: multiprocessing.process.BaseProcess, stage: str) -> None:
        self.request_stop()
        process.join(self.settings.shutdown_deadline_s + 20)
        if process.is_alive():
            process.kill()
            process.join()
            raise RuntimeError(f"fleet {stage} outlived its shutdown deadline and was killed")
        if process.exitcode:
            raise RuntimeError(f"fleet {stage} exited with code {process.exitcode}")

    def wait_assigned(self) -> None:
        """Block until the child's members have their partitions and the group is settled."""
        stage, timeout_s = self.settings.member.stage, self.settings.assignment_timeout_s
        process = self._process
        if process is None:
            raise RuntimeError(f"fleet {stage} is not started: wait inside `running()`")
        deadline = time.monotonic() + timeout_s + 30  # plus the child's start-up
        while not self._ready.wait(0.2):
            if not process.is_alive():
                raise RuntimeError(f"fleet {stage} exited with code {process.exitcode} "
                                   "before its members were assigned (its log says why)")
            if time.monotonic() > deadline:
                raise TimeoutError(f"fleet {stage} not ready within {timeout_s}s")

    @property
    def exitcode(self) -> int | None:
        """The child's exit code once it is gone (negative: the signal that ended it)."""
        return self._process.exitcode if self._process is not None else None

    def kill(self) -> None:
        """SIGKILL the child, as a crash of its machine would end it (a fault to measure)."""
        if self._process is not None and self._process.pid is not None:
            os.kill(self._process.pid, signal.SIGKILL)
            self._process.join()
            self._killed = True

    def request_stop(self) -> None:
        """Tell the child to stop without waiting for it (leaving `running` waits); a killed
        child is gone already, and may have left its stop event locked."""
        if not self._killed:
            self._stop.set()
