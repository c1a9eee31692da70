"""The core's wire format: tensors by value (small inline, big in /dev/shm files), errors that keep their status."""

from __future__ import annotations

import os
import pickle

import pytest
import torch

from mm_infer.engine_core import wire
from mm_infer.prompt.placeholders import PromptError


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32, torch.bfloat16, torch.int64])
def test_tensors_round_trip_bit_for_bit_small_inline_big_in_shared_memory(dtype):
    small = torch.arange(12).reshape(3, 4).to(dtype)
    big = (torch.arange(wire.SHM_MIN_BYTES) % 251).reshape(-1, 64).to(dtype)  # >= SHM_MIN_BYTES in every dtype
    data, files = wire.dumps(("add", {"small": small, "big": big.t(), "empty": torch.empty(0, 3, dtype=dtype)}))
    assert len(files) == 1 and os.path.exists(files[0])  # only the big one went to a file
    _, got = wire.loads(data)
    assert not os.path.exists(files[0])  # the reader took it
    assert torch.equal(got["small"], small) and torch.equal(got["big"], big.t()) and got["empty"].shape == (0, 3)
    assert got["big"].dtype == dtype


def test_plain_messages_need_no_tensor_hook():
    data, files = wire.dumps(("out", [1, 2, 3]), tensors=False)
    assert files == [] and wire.loads(data) == ("out", [1, 2, 3])


def test_unread_files_can_be_removed():
    _, files = wire.dumps(torch.zeros(wire.SHM_MIN_BYTES, dtype=torch.uint8))
    wire.remove_files(files)
    wire.remove_files(files)  # twice is fine
    assert not any(os.path.exists(f) for f in files)


def test_errors_keep_their_type_and_status_or_become_a_plain_error_with_it():
    err = wire.portable_error(PromptError("too long", param="messages"))
    assert isinstance(err, PromptError) and err.status == 400

    class Odd(Exception):
        status = 422

        def __init__(self, a: int, b: int) -> None:  # not rebuildable from its args
            super().__init__(f"{a}+{b}")

    plain = wire.portable_error(Odd(1, 2))  # its text is written for the client: kept bare, with its status
    assert type(plain) is RuntimeError and plain.status == 422 and str(plain) == "1+2"

    class Bare(Exception):
        def __init__(self, a: int, b: int) -> None:
            super().__init__(f"{a}+{b}")

    plain = wire.portable_error(Bare(1, 2))  # no status: a 500 naming its type
    assert type(plain) is RuntimeError and not hasattr(plain, "status") and str(plain) == "Bare: 1+2"


def test_an_engine_failed_request_crosses_with_its_status_and_text():
    """RequestFailedError does not rebuild from its args (Ray's UnserializableException): what crosses instead
    answers the same 400 body."""
    from mm_infer.engine.errors import NONFINITE_PARAMS, RequestFailedError
    from servers.openai.bodies.errors import from_exception

    err = RequestFailedError(NONFINITE_PARAMS)
    back = pickle.loads(pickle.dumps(wire.portable_error(err)))
    assert (back.status, str(back)) == (400, NONFINITE_PARAMS.message)
    assert vars(from_exception(back)) == vars(from_exception(err))


def test_cuda_tensors_are_refused():
    with torch._subclasses.fake_tensor.FakeTensorMode(allow_non_fake_inputs=True):
        t = torch.empty(4, device="cuda")
    with pytest.raises(TypeError, match="only CPU tensors"):
        wire.dumps(("add", t))


def test_outputs_cross_as_tuples_and_come_back_whole_but_the_prompt():
    """Every field of a two-sample output survives pack, pickle and unpack, but the prompt text and ids (the
    server holds them); prompt logprobs travel until sent once. A field dropped or shifted by one would show."""
    import pickle

    from mm_infer.engine.errors import RequestError
    from mm_infer.engine.outputs.request_output import CompletionOutput, RequestMetrics, RequestOutput

    samples = [CompletionOutput(0, " a", [5, 6], [-0.5, -1.5], None, None, [{5: -0.5}, {6: -1.5}], -2.0),
               CompletionOutput(1, "b", [7], [-0.25], "stop", 9, None, -0.25)]
    out = RequestOutput("r-1", "the prompt", [1, 2, 3], samples, False, [None, -1.0, -2.0], None, [None, 1, 3],
                        RequestMetrics(1.0, 2.0, None), 16, {"routed": 1}, RequestError(500, "boom"))
    back = wire.unpack_output(pickle.loads(pickle.dumps(wire.pack_output(out, prompt_sent=False), protocol=5)))
    assert back.prompt is None and back.prompt_token_ids == []
    for name in ("request_id", "outputs", "finished", "prompt_logprobs", "prompt_top_logprobs", "prompt_ranks",
                 "metrics", "num_cached_tokens", "extra"):
        assert getattr(back, name) == getattr(out, name), name
    assert (back.error.message, back.error.status) == ("boom", 500)
    again = wire.unpack_output(wire.pack_output(out, prompt_sent=True))
    assert again.prompt_logprobs is None and again.prompt_ranks is None and again.outputs == samples
