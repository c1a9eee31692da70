"""An empty weight-transfer round (TRL's `weight_update()` exiting before any tensor) is a 409 that resumes serving."""

from __future__ import annotations

import asyncio

import pytest

from mm_infer.engine.control.ops import ControlOp, DiscardWeights
from mm_infer.engine.control.sleep_state import SleepState
from mm_infer.serving import BackendFacts
from servers.openai.bodies.errors import ApiError
from servers.openai.control.pause import PauseGate
from servers.openai.control.sleep import SleepControl
from servers.openai.control.weight_transfer import TransferSession


class _Engine:
    """Just enough engine for a round that receives nothing."""

    facts, weight_version = BackendFacts(64, 100, 1), 3
    sleep_state = SleepState()

    def __init__(self) -> None:
        self.discarded = 0

    async def control(self, op: ControlOp) -> None:
        if isinstance(op, DiscardWeights):
            self.discarded += 1


def test_finishing_a_round_that_received_nothing_is_a_409_and_the_server_serves_again() -> None:
    """TRL 1.16 calls /finish_weight_update in a `finally`; the 409 used to leave the server paused in `wait`."""
    engine = _Engine()

    async def round_with_nothing() -> tuple[ApiError, PauseGate, TransferSession]:
        gate = PauseGate(engine)  # type: ignore[arg-type]
        session = TransferSession("gloo", engine, gate, SleepControl(False, engine, gate))  # type: ignore[arg-type]
        session.ready = True
        await session.start()
        assert gate.paused and gate.mode == "wait"
        with pytest.raises(ApiError) as err:
            await session.finish(None)
        return err.value, gate, session

    err, gate, session = asyncio.run(round_with_nothing())
    assert err.status == 409 and "no weights were received" in err.message
    assert not gate.paused and session.round is None and engine.discarded == 1
    assert engine.weight_version == 3
