"""Graceful shutdown: the first SIGTERM/SIGINT closes admission (503), lets in-flight requests finish for
--shutdown-timeout, ends the rest with a proper error, and only then stops uvicorn."""

from __future__ import annotations

import asyncio
import logging
from types import FrameType

import uvicorn

from servers.openai.state import ServerState

log = logging.getLogger("mm_infer.server")
SHUTTING_DOWN = "the server is shutting down"


class DrainingServer(uvicorn.Server):
    """uvicorn.Server whose first exit signal drains the server first; a second one exits as uvicorn does."""

    def __init__(self, config: uvicorn.Config, state: ServerState) -> None:
        super().__init__(config)
        self.state = state
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining = False

    async def serve(self, sockets=None) -> None:  # type: ignore[no-untyped-def]
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._draining or self._loop is None:
            super().handle_exit(sig, frame)
            return
        self._draining = True
        self._captured_signals.append(sig)  # re-raised once uvicorn is down, as its own handler would
        self._loop.call_soon_threadsafe(lambda: self._loop.create_task(self.drain()))  # type: ignore[union-attr]

    async def drain(self) -> None:
        timeout = self.state.config.shutdown_timeout_s
        log.warning("shutting down: admitting nothing, giving %d request(s) in flight up to %ss",
                    self.state.gate.num_inflight, timeout)
        try:
            aborted = await self.state.gate.close(timeout, SHUTTING_DOWN)
            if aborted:
                log.warning("shutdown: %d request(s) still running after %ss ended with an error", aborted, timeout)
        except Exception as exc:  # a dead engine must not keep the server up: it exits all the same
            log.error("shutdown: draining failed (%s); exiting anyway", exc)
        finally:
            self.should_exit = True
