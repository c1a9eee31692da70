"""CoreProcessBackend: the EngineBackend whose engine steps in its own process, restarted (and caught up) if it dies."""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from mm_infer.config import EngineConfig
from mm_infer.distributed.errors import ReplicaUnavailableError
from mm_infer.distributed.journal import WeightJournal
from mm_infer.distributed.slots import restart_delay_s
from mm_infer.engine.control.ops import Bucket, CommitWeights, ControlOp, Freeze, SleepStatus, UpdateWeights
from mm_infer.engine.control.sleep_state import SleepState
from mm_infer.engine.errors import RequestFailedError
from mm_infer.engine.outputs.edge import OutputEdge, wire_kind
from mm_infer.engine.outputs.request_output import RequestOutput
from mm_infer.engine.outputs.streams import OutputStream
from mm_infer.engine.sampling.params import SamplingParams
from mm_infer.engine_core import wire
from mm_infer.engine_core.core_client import CoreClient
from mm_infer.prompt.preparer import PromptPreparer
from mm_infer.prompt.request import VLMRequest
from mm_infer.serving import BackendFacts, MetaReference, Prompt, engine_gauges

log = logging.getLogger(__name__)


class CoreProcessBackend(MetaReference):
    """Prompts are prepared here (templating and media on this process's threads); the engine core process
    schedules, runs the model and samples. Refits are journaled so a restarted core catches up to the version."""

    def __init__(self, model_dir: str, options: dict[str, Any], restart: bool = True,
                 startup_timeout_s: float = 900.0) -> None:
        self.model_dir, self.options = model_dir, dict(options)
        config = EngineConfig.from_options(model_dir, **options)
        self.preparer = PromptPreparer(model_dir, config.media)
        self.restart, self.startup_timeout_s = restart, startup_timeout_s
        self.journal = WeightJournal()
        self.frozen = False
        self.restarts = 0
        self.last_failure: str | None = None
        self._closed = False
        self._lock = threading.Lock()  # the client swap on restart, the journal, `frozen`
        self._ids = itertools.count()
        self._watch_stop = threading.Event()
        self.client = CoreClient(model_dir, self.options, self._on_death, startup_timeout_s)
        self._version = int(self.client.info["weight_version"])
        self._sleep: SleepState = self.client.info["sleep_state"]
        info = self.client.info
        self.facts = BackendFacts(int(info["max_model_len"]), int(info["vocab_size"]), 1)
        self._watcher = threading.Thread(target=self._watch, name="mm-infer-core-watch", daemon=True)
        self._watcher.start()

    # EngineBackend: live state
    @property
    def is_alive(self) -> bool:
        return not self._closed and self.client.dead is None

    @property
    def weight_version(self) -> int:
        return self._version

    @property
    def sleep_state(self) -> SleepState:
        return self._sleep

    @property
    def pid(self) -> int | None:
        return self.client.process.pid

    # requests
    def _check_up(self) -> CoreClient:
        client = self.client
        if self._closed:
            raise ReplicaUnavailableError("the server is shutting down")
        if client.dead is not None:
            state = "restarting" if self.restart else "not restarted (restart is off)"
            raise ReplicaUnavailableError(f"the engine core process is down ({client.dead}); {state}: retry shortly")
        return client

    def _prepare(self, prompt: Prompt) -> VLMRequest:
        """The prepared request, on a server thread. Media stays uint8 frames (4x fewer bytes than rows): the core
        makes the rows, a group at a time, or embeds the frames on its device."""
        return self.preparer.prepare(prompt)

    async def generate(self, prompt: Prompt, params: SamplingParams | None, request_id: str,
                       affinity: str | None = None, stream: bool = True) -> AsyncIterator[RequestOutput]:
        """Outputs per params.output_kind (without `stream`, only the final one). A core that dies under the request
        ends it with ReplicaUnavailableError (503). Closing the iterator aborts the request."""
        params = params or SamplingParams()
        if not stream:
            params = params.final_only()
        self._check_up()  # before the media work: a core that is down answers at once
        loop = asyncio.get_running_loop()
        req = await loop.run_in_executor(None, self._prepare, prompt)
        client = self._check_up()  # after it: the core may have been restarted meanwhile
        edge = OutputEdge(params.output_kind, req.prompt_text, req.prompt_token_ids)
        wire_params = replace(params, output_kind=wire_kind(params.output_kind))
        out_stream = OutputStream(loop, wire_params.output_kind)
        hold = client.open(request_id, out_stream)
        finished = False
        files: list[str] = []  # the shared-memory files of its media
        try:
            files = client.post(("add", request_id, req, wire_params))
            while True:
                item, _ = await out_stream.get(hold, client.backpressure)
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                if item.error is not None:  # the engine failed this request alone: its 400 or 500, as in-thread
                    raise RequestFailedError(item.error)
                yield edge.take(item)
                if finished:
                    return
        finally:
            wire.remove_files(files)
            if not finished:
                client.close(request_id)
                if client.dead is None:
                    try:
                        client.post(("abort", request_id))
                    except ReplicaUnavailableError:
                        pass

    def abort(self, request_id: str) -> None:
        try:
            self.client.post(("abort", request_id))
        except ReplicaUnavailableError:
            pass

    # calls into the core
    async def _call(self, method: str, *args: Any) -> Any:
        return await asyncio.wrap_future(self._check_up().call(method, *args))

    async def control(self, op: ControlOp) -> Any:
        """Carried to the core as it is. Refits are journaled here (a commit keeps its staged tensors for that),
        so a restarted core catches up; the freeze and sleep state are mirrored for the same reason."""
        if isinstance(op, CommitWeights):
            op = replace(op, keep=True)
        result = await self._call("control", op)
        if isinstance(op, Freeze):
            self.frozen = op.frozen
        if isinstance(result, SleepState):
            self._sleep = result
        if isinstance(op, UpdateWeights):
            self._journal(op.bucket, op.version)
        elif isinstance(op, CommitWeights):
            self._journal(result[1], op.version)
            result = (result[0], None)
        if op.refit and self._sleep.weights == "unloaded":  # a level-2 sleeper serves again once all was refit
            self._sleep = await self._call("control", SleepStatus())
        return result

    def _journal(self, bucket: Bucket, version: int) -> None:
        with self._lock:
            self.journal.commit(self.journal.record(bucket, [name for name, _ in bucket], version))
        self._version = version

    def engine_gauges(self) -> dict[str, float]:
        stats = self.client.stats
        if not stats:
            return {}
        return {**engine_gauges(stats), "engine_core_restarts": self.restarts}

    # failure and restart
    def _on_death(self, reason: str) -> None:
        if self._closed:
            return
        self.last_failure = reason
        log.error("the engine core process died (%s)%s", reason, "; restarting it" if self.restart else "")
        if self.restart:
            threading.Thread(target=self._restart_loop, name="mm-infer-core-restart", daemon=True).start()

    def _restart_loop(self) -> None:
        failed = 0
        while not self._closed:
            time.sleep(restart_delay_s(failed))
            try:
                self._start_and_catch_up()
                return
            except Exception as exc:
                failed += 1
                self.last_failure = f"restart failed: {exc}"
                log.error("engine core restart %d failed: %s", failed, exc)

    def _start_and_catch_up(self) -> None:
        """A new core at the journal's version and the pause state, swapped in only once it has caught up."""
        client = CoreClient(self.model_dir, self.options, self._on_death, self.startup_timeout_s)
        try:
            with self._lock:
                entries, frozen = self.journal.since(-1), self.frozen
            for entry in entries:
                client.call("control", UpdateWeights(entry.ref, entry.version)).result(self.startup_timeout_s)
            client.call("control", Freeze(frozen)).result(60)
        except BaseException:
            client.kill()
            raise
        if self._closed:
            client.stop()
            return
        self.client = client
        self._sleep = client.info["sleep_state"]  # a fresh core is awake, whatever the one that died was
        self.restarts += 1
        log.warning("the engine core process was restarted (pid %s) at weight version %d", client.process.pid,
                    self._version)

    def _watch(self) -> None:
        """Once a second: abort requests whose readers stopped reading (their KV is freed in the core)."""
        while not self._watch_stop.wait(1.0):
            try:
                self.client.abort_stalled()
            except ReplicaUnavailableError:
                pass

    def kill_core(self) -> None:
        """Tests and operators: kill the core process now (SIGKILL), as a crash would."""
        self.client.kill()

    def shutdown(self) -> None:
        self._closed = True
        self._watch_stop.set()
        self.client.stop()
