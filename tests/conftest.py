"""Test-wide setup: never reach the model hub, keep tokenizers single-threaded."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Without CUDA, Triton runs only in its interpreter, and @triton.jit reads this flag when a function is decorated,
# triton.language's own helpers included: set it before anything (FakeTensorMode, inductor) can import triton, so
# that no test's outcome depends on the order the tests run in.
import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


import threading  # noqa: E402
from collections.abc import Iterator  # noqa: E402

import pytest  # noqa: E402

GATE_WAIT_S = 60.0  # the most a gated compile waits: a test that never opens the gate fails, it never hangs


@pytest.fixture()
def grammar_gate(monkeypatch) -> Iterator[threading.Event]:
    """Compiling a JSON schema with a "slow" property blocks until the gate opens: provably slower than anything
    else in the test (structured-output tests of who waits for whose grammar)."""
    from mm_infer.structured import compiler

    opened = threading.Event()
    real = compiler.GrammarCompiler._compile

    def gated(self, spec):
        if isinstance(spec.json, dict) and "slow" in spec.json.get("properties", {}):
            opened.wait(GATE_WAIT_S)
        return real(self, spec)

    monkeypatch.setattr(compiler.GrammarCompiler, "_compile", gated)
    yield opened
    opened.set()
