"""AsyncEngine: LLMEngine stepped on a background thread, one asyncio stream per request, abort on cancel, freeze."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any, TypeVar

from mm_infer.engine.control.ops import ControlOp, EngineControl, Freeze
from mm_infer.engine.engine import LLMEngine
from mm_infer.engine.errors import RequestFailedError
from mm_infer.engine.open_engine import open_engine
from mm_infer.engine.outputs.request_output import RequestOutput
from mm_infer.engine.outputs.streams import Backpressure, OutputStream
from mm_infer.engine.sampling.params import SamplingParams
from mm_infer.prompt.inputs import PromptInput
from mm_infer.prompt.request import VLMRequest

T = TypeVar("T")


class AsyncEngine:
    """Thread-safe front: generate() yields the request's outputs (per its output_kind) until finished."""

    def __init__(self, core: LLMEngine, backpressure: Backpressure | None = None) -> None:
        self.core = core
        self.backpressure = backpressure or Backpressure()
        self._lock = threading.Lock()  # one step, or one control call (add, abort, refit), at a time
        self._waiters = 0  # control calls waiting for the lock: the loop lets them in before its next step
        self._no_waiters = threading.Condition()
        self.last_progress = time.monotonic()  # end of the last step or control call
        self._wake = threading.Event()
        self._stop = False
        self.frozen = False  # while True the loop steps nothing: running requests keep their state (pause "keep")
        self._streams: dict[str, OutputStream] = {}
        self._ids = itertools.count()
        self._thread = threading.Thread(target=self._loop, name="mm-infer-engine", daemon=True)
        self._thread.start()

    @staticmethod
    def from_options(model_dir: str, **options: Any) -> AsyncEngine:
        return AsyncEngine(open_engine(model_dir, **options))

    async def generate(self, prompt: str | Mapping[str, Any] | PromptInput | VLMRequest,
                       params: SamplingParams | None = None, request_id: str | None = None,
                       stream: bool = True) -> AsyncIterator[RequestOutput]:
        """Outputs of one request (a prompt, or a VLMRequest prepared elsewhere) per its params' output_kind;
        without `stream`, only the final one. Cancelling (or closing) the iterator aborts the request."""
        if not self.is_alive:
            raise RuntimeError("the engine loop is not running (shut down or crashed); no request can be served")
        rid = request_id or f"async-{next(self._ids)}"
        params = params or SamplingParams()
        if not stream:
            params = params.final_only()
        loop = asyncio.get_running_loop()
        stream_out = OutputStream(loop, params.output_kind)
        req = await loop.run_in_executor(None, self.core.prepare, prompt)  # media work off the event loop
        # compiled (or failed: a 400) on the grammar threads, awaited by this request alone, under the deadline
        grammar = await self.core.grammars.wait(params.structured_outputs)
        with self._control():
            self.core.add_request(rid, req, params, grammar=grammar)
            self._streams[rid] = stream_out
        self._wake.set()
        finished = False
        try:
            while True:
                item, released = await stream_out.get(self.core.groups.get(rid), self.backpressure)
                if released:
                    self._wake.set()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            if not finished:
                self.abort(rid, notify=False)

    def abort(self, request_id: str, notify: bool = True) -> None:
        """Abort a request; with notify, its stream receives a final output with finish_reason "abort"."""
        with self._control():
            if not notify:
                self._streams.pop(request_id, None)
            self.core.abort(request_id)
        self._wake.set()

    @property
    def is_alive(self) -> bool:
        """True while the stepping thread runs (False after shutdown or if it died)."""
        return self._thread.is_alive() and not self._stop

    def stalled_for(self) -> float:
        """Seconds since the loop last made progress while it had work and was not frozen (0 when fine); requests
        held back for their slow readers are not work."""
        if self.frozen or not self.core.has_runnable():
            return 0.0
        return max(time.monotonic() - self.last_progress, 0.0)

    def set_frozen(self, frozen: bool) -> None:
        """Freeze (no step runs; queued and running requests wait with their KV) or thaw the loop. Freezing returns
        once a step already under way has landed: after it, nothing is generated until the thaw (it blocks for at
        most one step; call it off the event loop)."""
        self.frozen = frozen
        if frozen:
            with self._control():  # the loop checks `frozen` under the lock before each step
                pass
        self.last_progress = time.monotonic()  # a long freeze is not a stall
        self._wake.set()

    def run_locked(self, fn: Callable[..., T], *args: Any) -> T:
        """Run fn(*args) under the step lock: never in the middle of a step (weight refits, cache resets)."""
        with self._control():
            return fn(*args)

    @contextlib.contextmanager
    def _control(self) -> Iterator[None]:
        """The step lock for a call from outside the loop. A plain Lock is not fair: the loop would take it back
        step after step and starve an abort or a refit until the engine went idle, so the loop waits for us."""
        with self._no_waiters:
            self._waiters += 1
        try:
            with self._lock:
                yield
                self.last_progress = time.monotonic()
        finally:
            with self._no_waiters:
                self._waiters -= 1
                if not self._waiters:
                    self._no_waiters.notify_all()

    def _deliver(self, rid: str, item: Any, last: bool) -> None:
        stream = self._streams.pop(rid, None) if last else self._streams.get(rid)
        if stream is not None:
            stream.put(item, None if last else self.core.groups.get(rid), self.backpressure)

    def _abort_stalled(self) -> None:
        """Requests whose readers stopped reading for too long are aborted (under the lock): their KV is freed."""
        now = time.monotonic()
        for rid in [rid for rid, s in self._streams.items() if s.stalled(now, self.backpressure)]:
            self.core.abort(rid)

    def _loop(self) -> None:
        while not self._stop:
            with self._no_waiters:  # a control call is waiting for the lock: let it in first
                while self._waiters and not self._stop:
                    self._no_waiters.wait(timeout=0.1)
            try:
                with self._lock:
                    self._abort_stalled()
                    busy = not self.frozen and self.core.has_runnable()
                    outputs = self.core.step() if busy else None
                    if busy:
                        self.last_progress = time.monotonic()
                    for out in outputs or ():  # a request the engine failed gets its error, the others run on
                        item = out if out.error is None else RequestFailedError(out.error)
                        self._deliver(out.request_id, item, out.finished)
            except Exception as exc:  # the engine is broken: fail every open stream rather than hang
                with self._lock:
                    for rid in list(self._streams):
                        self._deliver(rid, exc, True)
                outputs = None
            if outputs is None:  # nothing to run (idle, frozen, or every request held for its reader)
                self._wake.wait(timeout=0.05)
                self._wake.clear()

    async def control(self, control: EngineControl, op: ControlOp) -> Any:
        """Apply a control operation off the event loop: a Freeze here (this loop steps the engine); others through
        `control`, under the step lock where the operation runs between steps."""
        if isinstance(op, Freeze):
            return await asyncio.to_thread(self.set_frozen, op.frozen)
        if op.between_steps:
            return await asyncio.to_thread(self.run_locked, control.apply, op)
        return await asyncio.to_thread(control.apply, op)

    def shutdown(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=5)
