"""The engine core process: one LLMEngine stepped on its main thread, fed and drained over one pipe."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any

import torch

from mm_infer.engine.control.ops import ControlOp, EngineControl, Freeze
from mm_infer.engine.engine import LLMEngine
from mm_infer.engine.open_engine import open_engine
from mm_infer.engine.outputs.request_output import RequestOutput
from mm_infer.engine.runner.host_allocator import keep_step_memory
from mm_infer.engine_core import wire
from mm_infer.engine_core.heap_trim import IdleTrimmer
from mm_infer.owned_child import ignore_group_signals
from mm_infer.parallel.group import RankLostError

STATS_INTERVAL_S = 0.1  # gauges reach the server at most this often while the engine is busy
GRAMMAR_POLL_S = 0.005  # how often an idle loop looks for compiled grammars while requests wait for theirs


class CoreLoop:
    """Reads requests, aborts, holds and calls from the server; steps the engine; sends its outputs back. Calls
    run between steps (so a refit never lands inside one); weight-transfer receives run on a side thread, as they
    do beside the step lock in one process."""

    def __init__(self, conn: Connection, engine: LLMEngine) -> None:
        self.conn = conn
        self.engine = engine
        self.engine_control = EngineControl(engine)
        self.frozen = False
        self.running = True
        self._send_lock = threading.Lock()
        self._side = ThreadPoolExecutor(1, thread_name_prefix="mm-infer-core-transfer")
        self._prompt_sent: set[str] = set()  # requests whose prompt logprobs already went out
        # requests waiting for their grammar (compiling on the grammar threads): id -> (request, params, future,
        # deadline); each joins the engine once its grammar is ready, or fails alone
        self._awaiting: dict[str, tuple[Any, Any, Future[Any], float]] = {}
        self._stats_at = 0.0
        self._trimmer = IdleTrimmer()
        self._calls: dict[str, Callable[..., Any]] = {"control": self._control, "stats": self.stats,
                                                      "raise": self._raise}

    def send(self, message: Any, tensors: bool = False) -> None:
        data, _ = wire.dumps(message, tensors)
        with self._send_lock:
            self.conn.send_bytes(data)

    def describe(self) -> dict[str, Any]:
        runtime = self.engine.runtime
        return {"pid": os.getpid(), "max_model_len": runtime.max_model_len, "vocab_size": runtime.vocab_size,
                "weight_version": self.engine.weight_version, "device": str(self.engine.device),
                "sleep_state": self.engine.sleep_state, "cpu_threads": torch.get_num_threads(),
                "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY")}

    def stats(self) -> dict[str, Any]:
        return {**self.engine.stats(), "weight_version": self.engine.weight_version}

    # messages
    def handle(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "add":
            self._add(*message[1:])
        elif kind == "abort":
            if self._awaiting.pop(message[1], None) is None:
                self.engine.abort(message[1])
        elif kind == "hold":
            group = self.engine.groups.get(message[1])
            if group is not None:
                group.held = message[2]
        elif kind == "call":
            self._call(*message[1:])
        elif kind == "stop":
            self.running = False

    def _add(self, request_id: str, request: Any, params: Any) -> None:
        """Queue the request; one with a grammar not yet compiled waits for it off the step loop."""
        spec = params.structured_outputs
        if spec is None:
            self._admit(request_id, request, params, None)
            return
        try:
            future = self.engine.grammars.submit(spec)
        except Exception as exc:  # over the size cap
            self.send(("failed", request_id, wire.portable_error(exc)))
            return
        if future.done():
            self._admit(request_id, request, params, future)
        else:
            self._awaiting[request_id] = (request, params, future,
                                          time.monotonic() + self.engine.grammars.timeout_s)

    def _admit(self, request_id: str, request: Any, params: Any, grammar: Future[Any] | None) -> None:
        try:
            compiled = None if grammar is None else grammar.result()
            self.engine.add_request(request_id, request, params, grammar=compiled)
        except Exception as exc:  # a 4xx (prompt too long, bad grammar, asleep): that request only
            self.send(("failed", request_id, wire.portable_error(exc)))

    def _admit_compiled(self) -> None:
        """Requests whose grammar is ready join the engine; those past the grammar deadline fail (400)."""
        now = time.monotonic()
        for rid, (request, params, future, deadline) in list(self._awaiting.items()):
            if future.done():
                del self._awaiting[rid]
                self._admit(rid, request, params, future)
            elif now > deadline:
                del self._awaiting[rid]
                self.send(("failed", rid, wire.portable_error(self.engine.grammars.timed_out())))

    def _call(self, call_id: int, method: str, args: tuple[Any, ...]) -> None:
        """Control operations that need no step boundary (a broadcast staging tensors) run on the side thread;
        everything else here, between steps."""
        if method == "control" and not args[0].between_steps:
            self._side.submit(self._reply, call_id, self._control, args)
        else:
            self._reply(call_id, self._calls[method], args)

    def _reply(self, call_id: int, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        try:
            self.send(("reply", call_id, True, fn(*args)), tensors=True)  # commit_weights returns tensors
        except Exception as exc:
            self.send(("reply", call_id, False, wire.portable_error(exc)))

    def _control(self, op: ControlOp) -> Any:
        if isinstance(op, Freeze):  # no step runs while this call does, so none is under way once it returns
            self.frozen = op.frozen
            return None
        return self.engine_control.apply(op)

    @staticmethod
    def _raise(message: str) -> None:
        raise RuntimeError(message)  # tests: an engine-side failure reaches the caller as an error

    # the loop
    def _outputs(self, outputs: list[RequestOutput]) -> list[tuple]:
        slim = []
        for out in outputs:
            sent = out.request_id in self._prompt_sent
            slim.append(wire.pack_output(out, sent))
            if out.finished:
                self._prompt_sent.discard(out.request_id)
            elif out.prompt_logprobs is not None:
                self._prompt_sent.add(out.request_id)
        return slim

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except RankLostError as exc:  # a tensor-parallel rank died: this process ends, its backend starts all anew
            self.send(("broken", wire.portable_error(exc)))
            raise
        except Exception as exc:  # the engine itself is broken: every open request fails, the loop goes on
            self.send(("broken", wire.portable_error(exc)))
            self.engine.abort_many(list(self.engine.groups))  # their abort outputs find no reader: dropped
            return
        if outputs:
            self.send(("out", self._outputs(outputs)))
        now = time.monotonic()
        if now - self._stats_at > STATS_INTERVAL_S:
            self._stats_at = now
            self.send(("stats", self.stats()))

    def run(self) -> None:
        """Until told to stop (or the server's end of the pipe closes): drain messages, then step once."""
        while self.running:
            busy = self._busy()
            if not busy and not self._awaiting:
                self._trimmer.idle()  # freed heap back to the OS before the gauges settle
                self.send(("stats", self.stats()))  # going idle: the gauges as they settle
            if self.conn.poll(0 if busy else GRAMMAR_POLL_S if self._awaiting else None):
                self._drain()
            if self._awaiting:
                self._admit_compiled()
            if self.running and self._busy():
                self._step()

    def _busy(self) -> bool:
        return not self.frozen and self.engine.has_runnable()

    def _drain(self, most: int = 256) -> None:
        """Handle the messages waiting now (at most `most`: a flood of requests must not starve the step)."""
        for _ in range(most):
            if not self.running or not self.conn.poll(0):
                return
            self.handle(wire.loads(self.conn.recv_bytes()))


def core_main(conn: Connection, model_dir: str, options: dict[str, Any]) -> None:
    """The core process's entry point: build the engine, say it is ready (or why it is not), serve."""
    ignore_group_signals()
    keep_step_memory()
    try:
        engine = open_engine(model_dir, **options)
    except BaseException as exc:
        data, _ = wire.dumps(("startup_failed", wire.portable_error(exc)))
        conn.send_bytes(data)
        raise SystemExit(1) from None
    loop = CoreLoop(conn, engine)
    loop.send(("ready", loop.describe()))
    try:
        loop.run()
    except (EOFError, OSError):  # the server went away
        pass
