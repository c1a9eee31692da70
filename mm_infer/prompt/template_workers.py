"""Request-supplied chat templates render in killable subprocesses: a deadline, an output cap, a memory limit.

The checkpoint's template (and the operator's --chat-template) render in process; a template that came with a
request is someone else's code, so it runs here: a worker past its deadline is killed and replaced, and the threads
that wait on workers are this pool's own, so a hostile template can hold neither the default executor nor anyone
who did not send one. Run as `python -m mm_infer.prompt.template_workers MEMORY_BYTES` it is one worker."""

from __future__ import annotations

import asyncio
import json
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from mm_infer.owned_child import ignore_group_signals
from mm_infer.prompt.placeholders import PromptError

_HEADER = 8  # bytes of big-endian length before each JSON message
_READY = b"R"
_STARTUP_TIMEOUT_S = 60.0  # a worker's interpreter start; not charged to a request's deadline


@dataclass(frozen=True)
class TemplateLimits:
    """How request-supplied chat templates run: `workers` subprocesses (requests beyond them queue, and wait at most
    `timeout_s` for one), each render killed after `timeout_s`, each worker's memory capped at `memory_bytes` above
    its start."""

    workers: int = 2
    timeout_s: float = 5.0
    memory_bytes: int = 1 << 30
    max_queued: int = 64  # renders waiting for a worker beyond this are refused (503) at once

    def __post_init__(self) -> None:
        if self.workers < 1 or self.timeout_s <= 0 or self.memory_bytes < 1 << 24 or self.max_queued < 0:
            raise ValueError(f"bad template limits: {self}")


class TemplateTimeoutError(PromptError):
    """The request's chat template did not finish within the deadline (its worker was killed)."""


class TemplateBusyError(PromptError):
    """Every template worker stayed busy past the deadline: retry later."""

    status = 503


# --- the worker (child side) ------------------------------------------------------------------------------------

def _limit_memory(budget: int) -> None:
    """RLIMIT_AS at what this process maps now plus `budget` (a MemoryError in the template, not the host's OOM)."""
    try:
        import resource

        with open("/proc/self/statm") as f:
            mapped = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        want = mapped + budget
        resource.setrlimit(resource.RLIMIT_AS, (want if hard == resource.RLIM_INFINITY else min(want, hard), hard))
    except (OSError, ValueError, ImportError):  # not Linux: the deadline still bounds it
        pass


def _read_exact(stream: BinaryIO, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = stream.read(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _send(stream: BinaryIO, message: Mapping[str, Any]) -> None:
    data = json.dumps(message).encode()  # ASCII: a lone surrogate travels as an escape
    stream.write(len(data).to_bytes(_HEADER, "big") + data)
    stream.flush()


def _render_job(job: Mapping[str, Any], cache: dict[str, Any]) -> dict[str, Any]:
    from mm_infer.prompt.jinja_env import compile_template, render

    try:
        source = job["source"]
        template = cache.get(source)
        if template is None:
            if len(cache) >= 4:
                cache.clear()
            template = cache[source] = compile_template(source)
        text = render(template, job["max_chars"], messages=job["messages"], **job["context"])
        return {"text": text}
    except MemoryError:
        return {"error": "the chat template ran out of its worker's memory", "restart": True}
    except RecursionError:
        return {"error": "the chat template recursed too deeply", "restart": True}
    except Exception as e:  # the template's own errors (syntax, raise_exception, the sandbox's caps)
        return {"error": f"{type(e).__name__}: {e}"}


def worker_main(memory_bytes: int) -> None:
    """Serve render jobs on stdin/stdout until stdin closes (or a job leaves the worker unfit to go on)."""
    ignore_group_signals()
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")  # the protocol's own; a stray print cannot corrupt it
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    stdin = sys.stdin.buffer
    import mm_infer.prompt.jinja_env  # noqa: F401  (imported before the memory limit and the ready byte)

    _limit_memory(memory_bytes)
    out.write(_READY)
    out.flush()
    cache: dict[str, Any] = {}
    while (header := _read_exact(stdin, _HEADER)) is not None:
        body = _read_exact(stdin, int.from_bytes(header, "big"))
        if body is None:
            return
        reply = _render_job(json.loads(body), cache)
        _send(out, reply)
        if reply.get("restart"):
            return


# --- the pool (parent side) -------------------------------------------------------------------------------------

class _Worker:
    def __init__(self, memory_bytes: int) -> None:
        root = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
        self.proc = subprocess.Popen([sys.executable, "-m", "mm_infer.prompt.template_workers", str(memory_bytes)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     env=env, close_fds=True, start_new_session=True)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout.fileno()
        if self._read(1, time.monotonic() + _STARTUP_TIMEOUT_S) != _READY:
            self.kill()
            raise RuntimeError("a chat template worker did not start")

    def _read(self, n: int, deadline: float) -> bytes:
        data = b""
        while len(data) < n:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.stdout], [], [], left)[0]:
                raise TimeoutError
            chunk = os.read(self.stdout, n - len(data))
            if not chunk:
                raise EOFError("the template worker exited")
            data += chunk
        return data

    def ask(self, job: bytes, deadline: float) -> dict[str, Any]:
        self.stdin.write(len(job).to_bytes(_HEADER, "big") + job)
        self.stdin.flush()
        size = int.from_bytes(self._read(_HEADER, deadline), "big")
        return json.loads(self._read(size, deadline))

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.stdin.close()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class TemplateWorkers:
    """A pool of template workers started on first use; `render` returns a future, `render_async` awaits one (on
    this pool's threads, never the event loop's default executor)."""

    def __init__(self, limits: TemplateLimits | None = None) -> None:
        self.limits = limits or TemplateLimits()
        self._executor = ThreadPoolExecutor(self.limits.workers, thread_name_prefix="mm-infer-template")
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()
        self._queued = 0
        self._closed = False
        self.killed = 0  # workers killed at their deadline (a gauge for tests and operators)

    def submit(self, source: str, messages: Sequence[Mapping[str, Any]], context: Mapping[str, Any],
               max_chars: int) -> Future[str]:
        """Render `source` with `messages` and `context` (add_generation_prompt, special tokens, kwargs) in a worker;
        the future raises PromptError (400) for a failing template, TemplateTimeoutError (400) at the deadline,
        TemplateBusyError (503) when no worker came free in time."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the template workers are closed")
            if self._queued >= self.limits.workers + self.limits.max_queued:
                raise TemplateBusyError(f"{self._queued} chat templates are rendering or waiting, the most this server "
                                        "takes at once; retry later", param="chat_template")
            self._queued += 1
        job = {"source": source, "messages": list(messages), "context": dict(context), "max_chars": max_chars}
        return self._executor.submit(self._run, job, time.monotonic())

    async def render_async(self, source: str, messages: Sequence[Mapping[str, Any]], context: Mapping[str, Any],
                           max_chars: int) -> str:
        return await asyncio.wrap_future(self.submit(source, messages, context, max_chars))

    def _run(self, job: dict[str, Any], submitted: float) -> str:
        try:
            limit = self.limits.timeout_s
            if time.monotonic() - submitted > limit:
                raise TemplateBusyError(f"no chat template worker came free within {limit:g}s (--template-timeout); "
                                        "retry later", param="chat_template")
            data = json.dumps(job).encode()
            worker = self._take()
            try:
                reply = worker.ask(data, time.monotonic() + limit)
            except TimeoutError:
                worker.kill()
                self.killed += 1
                raise TemplateTimeoutError(f"the chat template did not finish rendering within {limit:g}s "
                                           "(--template-timeout)", param="chat_template") from None
            except (OSError, EOFError, ValueError):
                worker.kill()
                raise PromptError("the chat template's worker died while rendering it (over its memory limit?)",
                                  param="chat_template") from None
            if reply.get("restart"):
                worker.kill()
            else:
                self._give_back(worker)
            if "error" in reply:
                raise PromptError(f"chat template failed: {reply['error']}", param="chat_template")
            return str(reply["text"])
        finally:
            with self._lock:
                self._queued -= 1

    def _take(self) -> _Worker:
        with self._lock:
            while self._idle:
                worker = self._idle.pop()
                if worker.alive():
                    return worker
                worker.kill()
        return _Worker(self.limits.memory_bytes)

    def _give_back(self, worker: _Worker) -> None:
        with self._lock:
            if self._closed:
                worker.kill()
            else:
                self._idle.append(worker)

    def close(self) -> None:
        """Kill idle workers; a render under way ends at its deadline."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.kill()
        self._executor.shutdown(wait=False, cancel_futures=True)


if __name__ == "__main__":
    worker_main(int(sys.argv[1]))
