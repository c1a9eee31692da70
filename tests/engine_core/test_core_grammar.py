"""Issue 32 (3): the engine core compiles grammars off its step loop. A request waits for its own grammar, nobody
else does; the wait has a deadline and the schema a size cap, each a 400 for that request alone."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from multiprocessing import Pipe
from pathlib import Path

import pytest

from mm_infer import SamplingParams
from mm_infer.engine.engine import LLMEngine
from mm_infer.engine_core import wire
from mm_infer.engine_core.core_loop import CoreLoop
from mm_infer.structured import StructuredOutputsParams as Spec

CKPT = Path(__file__).resolve().parents[2] / "assets" / "models" / "tiny-qwen2-vl"
WAIT_S = 60.0  # the most any step of these tests waits for a message (a hang fails, it never passes)


def slow(tag: str) -> dict:
    """A schema whose compile waits on the gate (each test its own: a compiled one is cached)."""
    return {"type": "object", "properties": {"slow": {"type": "integer"}, tag: {"type": "integer"}},
            "required": ["slow", tag]}


@pytest.fixture(scope="module")
def engine() -> LLMEngine:
    return LLMEngine.from_options(str(CKPT), num_kv_blocks=256, max_model_len=1024, cpu_threads=1)


@pytest.fixture()
def gate(grammar_gate) -> threading.Event:
    return grammar_gate


class Core:
    """A CoreLoop on a thread of this process, fed and drained over a real pipe as the server feeds it."""

    def __init__(self, engine: LLMEngine) -> None:
        self.conn, theirs = Pipe()
        self.loop = CoreLoop(theirs, engine)
        self.thread = threading.Thread(target=self.loop.run, daemon=True)
        self.thread.start()
        self.done: dict[str, object] = {}  # request id -> final RequestOutput or the exception it failed with

    def add(self, rid: str, prompt: str, params: SamplingParams) -> None:
        req = self.loop.engine.prepare(prompt)
        self.conn.send_bytes(wire.dumps(("add", rid, req, params), tensors=True)[0])

    def wait_for(self, rid: str) -> object:
        deadline = time.monotonic() + WAIT_S
        while rid not in self.done:
            assert self.conn.poll(max(deadline - time.monotonic(), 0)), f"{rid} never finished (the loop is stuck)"
            message = wire.loads(self.conn.recv_bytes())
            if message[0] == "out":
                for packed in message[1]:
                    out = wire.unpack_output(packed)
                    if out.finished:
                        self.done[out.request_id] = out
            elif message[0] == "failed":
                self.done[message[1]] = message[2]
        return self.done[rid]

    def stop(self) -> None:
        self.conn.send_bytes(wire.dumps(("stop",))[0])
        self.thread.join(10)


@pytest.fixture()
def core(engine) -> Iterator[Core]:
    c = Core(engine)
    yield c
    c.stop()


def plain(**kw) -> SamplingParams:
    return SamplingParams(**{"max_tokens": 8, "temperature": 0.0, "ignore_eos": True, **kw})


def test_an_innocent_stream_finishes_while_another_requests_grammar_compiles(core, gate):
    # the bug: CoreLoop._add compiled on the step loop, so every other stream froze for the whole compile (19 s for
    # a 1.2 MB schema): here the innocent request would never finish while the gate is shut
    spec = Spec(json=slow("stream"))
    core.add("grammar", "a json object:", plain(max_tokens=16, ignore_eos=False, structured_outputs=spec))
    core.add("innocent", "hello there", plain())
    out = core.wait_for("innocent")
    assert not gate.is_set(), "the innocent request finished only after the grammar compiled"
    assert len(out.outputs[0].token_ids) == 8 and out.outputs[0].finish_reason == "length"
    gate.set()
    constrained = core.wait_for("grammar")
    assert constrained.outputs[0].text.lstrip().startswith("{")  # the grammar did constrain it once compiled


def test_a_grammar_past_its_deadline_fails_that_request_alone(core, gate, engine, monkeypatch):
    grammars = engine.grammars
    monkeypatch.setattr(grammars, "config", replace(grammars.config, grammar_timeout_s=0.3))
    start = time.monotonic()
    core.add("grammar", "a json object:", plain(structured_outputs=Spec(json=slow("deadline"))))
    core.add("innocent", "hello there", plain())
    failed = core.wait_for("grammar")
    assert isinstance(failed, ValueError) and getattr(failed, "status", None) == 400
    assert "did not compile within 0.3s" in str(failed)
    assert time.monotonic() - start < WAIT_S / 2  # the deadline ended it, not the gate's own timeout
    assert core.wait_for("innocent").outputs[0].finish_reason == "length"


def test_a_schema_over_the_size_cap_is_a_400_naming_it(core, engine, monkeypatch):
    grammars = engine.grammars
    monkeypatch.setattr(grammars, "config", replace(grammars.config, max_grammar_bytes=2048))
    huge = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(200)}}
    core.add("huge", "x", plain(structured_outputs=Spec(json=huge)))
    failed = core.wait_for("huge")
    assert getattr(failed, "status", None) == 400 and "over this server's limit of 2048 bytes" in str(failed)
    core.add("small", "x", plain(structured_outputs=Spec(json={"type": "object"})))
    assert core.wait_for("small").outputs[0].finish_reason in ("length", "stop")


def test_an_abort_while_waiting_for_the_grammar_drops_the_request(core, gate, engine):
    core.add("grammar", "a json object:", plain(structured_outputs=Spec(json=slow("abort"))))
    core.conn.send_bytes(wire.dumps(("abort", "grammar"))[0])
    core.add("innocent", "hello there", plain())
    core.wait_for("innocent")
    gate.set()
    time.sleep(0.2)
    assert "grammar" not in engine.groups and not core.loop._awaiting
