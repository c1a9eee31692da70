"""CoreClient: one engine core process, its pipe, the thread reading it, calls by id, and death noticed at once."""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing as mp
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

from mm_infer.distributed.errors import ReplicaUnavailableError, describe_failure
from mm_infer.engine.outputs.streams import Backpressure, OutputStream
from mm_infer.engine_core import wire
from mm_infer.engine_core.core_loop import core_main


class CoreStartupError(RuntimeError):
    """The core process could not load the engine (its own error is the message)."""


def exit_reason(code: int | None) -> str:
    """How a process ended, in words: 'exit code 3', 'killed by SIGKILL'."""
    if code is None:
        return "its pipe closed while it still ran"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class RemoteHold:
    """Stands in for a SequenceGroup in OutputStream: setting `held` tells the core to hold or release it."""

    def __init__(self, client: CoreClient, request_id: str) -> None:
        self._client, self._rid, self._held = client, request_id, False

    @property
    def held(self) -> bool:
        return self._held

    @held.setter
    def held(self, value: bool) -> None:
        self._held = value
        self._client.post(("hold", self._rid, value))


def core_options(options: dict[str, Any]) -> dict[str, Any]:
    """The engine options the core runs with: unless told (`cpu_threads`, or OMP_NUM_THREADS), one core of this
    machine is left to the server process (as vLLM's CPU build keeps one for its front end), so torch's intra-op
    threads are all but one; heavy steps (an encode, a long prefill: step_threads.py) take every core."""
    if options.get("cpu_threads") or os.environ.get("OMP_NUM_THREADS"):
        return options
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return {"cpu_threads_heavy": cores, **options, "cpu_threads": max(1, cores - 1)}


@contextlib.contextmanager
def core_environment() -> Iterator[None]:
    """The environment the spawned core inherits: OpenMP workers that sleep when idle (OMP_WAIT_POLICY=PASSIVE,
    unless set), since spinning ones take the CPU the server process streams with."""
    added = "OMP_WAIT_POLICY" not in os.environ
    if added:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    try:
        yield
    finally:
        if added:
            os.environ.pop("OMP_WAIT_POLICY", None)


class CoreClient:
    """Starts the process (spawned: no CUDA state is forked) and waits for its engine. `on_death(reason)` runs once,
    on the reader thread, when the pipe breaks; every open stream and call has failed with a 503 by then."""

    def __init__(self, model_dir: str, options: dict[str, Any], on_death: Callable[[str], None],
                 startup_timeout_s: float = 900.0, backpressure: Backpressure | None = None) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe(duplex=True)
        self.process = ctx.Process(target=core_main, args=(child, model_dir, core_options(options)),
                                   name="mm-infer-engine-core", daemon=True)
        with core_environment():
            self.process.start()
        child.close()
        self.backpressure = backpressure or Backpressure()
        self.streams: dict[str, tuple[OutputStream, RemoteHold]] = {}
        self.stats: dict[str, Any] = {}
        self.dead: str | None = None
        self._on_death = on_death
        self._send_lock = threading.Lock()
        self._calls: dict[int, Future[Any]] = {}
        self._ids = itertools.count()
        self.info = self._wait_ready(startup_timeout_s)
        self._reader = threading.Thread(target=self._read, name="mm-infer-core-reader", daemon=True)
        self._reader.start()

    def _wait_ready(self, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while not self._conn.poll(0.1):
            if not self.process.is_alive():
                raise CoreStartupError(f"the engine core process ended during start-up "
                                       f"({exit_reason(self.process.exitcode)})")
            if time.monotonic() > deadline:
                self.kill()
                raise CoreStartupError(f"the engine core process did not load the model within {timeout_s:g} s")
        kind, payload = wire.loads(self._conn.recv_bytes())
        if kind == "startup_failed":
            self.process.join(5)
            raise CoreStartupError(f"the engine core could not start: {describe_failure(payload)}") from payload
        return payload

    # to the core
    def post(self, message: tuple[Any, ...]) -> list[str]:
        """Send one message; the shared-memory files it wrote (the core removes them when it reads them)."""
        data, files = wire.dumps(message, tensors=message[0] in ("add", "call"))
        try:
            with self._send_lock:
                self._conn.send_bytes(data)
        except (OSError, ValueError) as exc:  # the core is gone (the reader thread reports why)
            wire.remove_files(files)
            raise ReplicaUnavailableError(f"the engine core process is not running ({self.dead or exc})") from exc
        return files

    def call(self, method: str, *args: Any) -> Future[Any]:
        """Run engine-side `method(*args)` between steps; the future holds its result or its exception."""
        future: Future[Any] = Future()
        if self.dead is not None:
            future.set_exception(ReplicaUnavailableError(f"the engine core process is down ({self.dead})"))
            return future
        call_id = next(self._ids)
        self._calls[call_id] = future
        try:
            self.post(("call", call_id, method, args))
        except ReplicaUnavailableError as exc:
            self._calls.pop(call_id, None)
            future.set_exception(exc)
        return future

    def open(self, request_id: str, stream: OutputStream) -> RemoteHold:
        hold = RemoteHold(self, request_id)
        self.streams[request_id] = (stream, hold)
        return hold

    def close(self, request_id: str) -> None:
        self.streams.pop(request_id, None)

    # from the core (the reader thread)
    def _deliver(self, request_id: str, item: Any, last: bool) -> None:
        entry = self.streams.pop(request_id, None) if last else self.streams.get(request_id)
        if entry is not None:
            stream, hold = entry
            stream.put(item, None if last else hold, self.backpressure)

    def _dispatch(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "out":
            for packed in message[1]:
                out = wire.unpack_output(packed)
                self._deliver(out.request_id, out, out.finished)
        elif kind == "stats":
            self.stats = message[1]
        elif kind == "reply":
            future = self._calls.pop(message[1], None)
            if future is not None:
                future.set_result(message[3]) if message[2] else future.set_exception(message[3])
        elif kind == "failed":
            self._deliver(message[1], message[2], True)
        elif kind == "broken":
            for rid in list(self.streams):
                self._deliver(rid, message[1], True)

    def _read(self) -> None:
        try:
            while True:
                self._dispatch(wire.loads(self._conn.recv_bytes()))
        except (EOFError, OSError):
            pass
        deadline = time.monotonic() + 2.0  # another thread may be reaping it (kill): poll, don't join twice
        while self.process.exitcode is None and time.monotonic() < deadline:
            time.sleep(0.01)
        self.dead = f"pid {self.process.pid}, {exit_reason(self.process.exitcode)}"
        for rid in list(self.streams):
            self._deliver(rid, ReplicaUnavailableError(
                f"the engine core process ({self.dead}) died while serving request {rid!r}; the request was not "
                "completed and was not retried: send it again"), True)
        for call_id in list(self._calls):
            self._calls.pop(call_id).set_exception(
                ReplicaUnavailableError(f"the engine core process ({self.dead}) died during this call"))
        self._on_death(self.dead)

    def abort_stalled(self) -> None:
        """Abort requests whose readers stopped reading for too long (the core frees their KV)."""
        now = time.monotonic()
        for rid, (stream, _) in list(self.streams.items()):
            if stream.stalled(now, self.backpressure):
                self.post(("abort", rid))

    # lifetime
    def stop(self, timeout_s: float = 10.0) -> None:
        try:
            self.post(("stop",))
        except ReplicaUnavailableError:
            pass
        self.process.join(timeout_s)
        self.kill()

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5.0)
