"""Sleep / wake over HTTP (vLLM's /sleep, /wake_up, /is_sleeping): the pause gate answers 503 while asleep."""

from __future__ import annotations

from typing import Any

from mm_infer.engine.control.ops import Sleep, WakeUp
from mm_infer.engine.control.sleep import TAGS
from mm_infer.engine.control.sleep_state import EngineAsleepError, SleepState
from mm_infer.serving import EngineBackend
from servers.openai.bodies.errors import ApiError
from servers.openai.control.pause import PauseGate

SLEEP_MODES = ("abort", "wait")  # "keep" would hold requests whose KV the sleep frees


class SleepControl:
    """Pauses before a sleep (mode abort by default, as vLLM) and resumes once the engine serves again: awake,
    and after a level-2 sleep, refit."""

    def __init__(self, enabled: bool, engine: EngineBackend, gate: PauseGate) -> None:
        self.enabled = enabled
        self.engine = engine
        self.gate = gate
        self._paused_here = False  # the sleep paused the gate: the wake-up (or the refit after it) resumes it

    def _check_enabled(self) -> None:
        if not self.enabled:
            raise ApiError(400, "sleep mode is off: start the server with --enable-sleep-mode")

    @property
    def is_sleeping(self) -> bool:
        return self.engine.sleep_state.is_sleeping

    async def sleep(self, level: int, mode: str) -> dict[str, Any]:
        self._check_enabled()
        if level not in (1, 2):
            raise ApiError(400, f"level must be 1 or 2, got {level} (level 0 only pauses: use /pause)",
                           param="level")
        if mode not in SLEEP_MODES:
            raise ApiError(400, f"mode {mode!r} is not one of {list(SLEEP_MODES)} (a sleep frees the KV cache that "
                           "mode keep would hold)", param="mode")
        if not self.gate.paused:
            await self.gate.pause(mode)  # type: ignore[arg-type]
            self._paused_here = True
        try:
            state = await self.engine.control(Sleep(level))
        except EngineAsleepError as e:
            await self._sync(self.engine.sleep_state)
            raise ApiError(409, str(e)) from None
        await self._sync(state)
        return {"status": "sleeping" if state.is_sleeping else "awake", "level": level}

    async def wake_up(self, tags: list[str] | None) -> dict[str, Any]:
        self._check_enabled()
        if tags is not None and (unknown := sorted(set(tags) - set(TAGS))):
            raise ApiError(400, f"unknown tags {unknown}: use {list(TAGS)}", param="tags")
        state = await self.engine.control(WakeUp(None if tags is None else tuple(tags)))
        await self._sync(state)
        return {"status": "sleeping" if state.is_sleeping else "awake", "tags": tags}

    def check_refit(self) -> None:
        """A refit needs weight memory: 409 while a level-2 sleep holds the weights discarded."""
        if self.engine.sleep_state.weights == "discarded":
            raise ApiError(409, "the weights were discarded by /sleep?level=2: POST /wake_up?tags=weights first")

    async def after_refit(self) -> None:
        await self._sync(self.engine.sleep_state)

    async def _sync(self, state: SleepState) -> None:
        """Refuse requests (503 naming why) while the engine cannot serve; else resume what the sleep paused."""
        reason = state.reason()
        self.gate.refuse(reason)
        if reason is None and self._paused_here:
            self._paused_here = False
            await self.gate.resume()
