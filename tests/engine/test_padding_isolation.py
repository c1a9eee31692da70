"""One request's NaN never reaches another's: padded reads gather a zero block, reused blocks are cleared first.

Attention masks padding by giving it probability 0, and 0 x NaN is NaN: a padded read of a slot another sequence
wrote (decode padding used to point at slot 0) or of a reused block's stale tail poisons an innocent row.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest
import torch
from engine_cases import CKPT, case

from mm_infer import LLM, SamplingParams

# text and image requests of unequal lengths; the 70-token one prefills in chunks beside the others' decode rows
INNOCENT = [case([12], 1), case([3, ("image", 1, 4, 4), 9], 2), case([40], 3), case([5, ("image", 1, 6, 10), 2], 4),
            case([70], 5)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, logprobs=2)
PARAMS = [GREEDY, SamplingParams(temperature=0.9, top_p=0.9, seed=7, max_tokens=20, ignore_eos=True, logprobs=2),
          GREEDY, GREEDY, GREEDY]
MODES = pytest.mark.parametrize("batch_invariant", [False, True], ids=["static-decode", "bucketed-decode"])


@pytest.fixture
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _engine(batch_invariant: bool) -> LLM:
    # a small token budget: chunked prefill, so steps mix prefill chunks with decode rows (the bucketed decode path)
    return LLM(str(CKPT), num_kv_blocks=64, max_num_batched_tokens=48, cpu_threads=1, batch_invariant=batch_invariant)


def _outs(llm: LLM, prompts: list[dict], params: list[SamplingParams]) -> list[tuple]:
    return [(o.outputs[0].token_ids, o.outputs[0].logprobs, o.outputs[0].finish_reason)
            for o in llm.generate(prompts, params, use_tqdm=False)]


def _stale_nan_everywhere(batch_invariant: bool) -> None:
    """What poisoned sequences could leave behind, everywhere at once: NaN in every block the manager hands out and
    in the static decode scratch block; innocent outputs stay bit for bit a clean engine's, prefix hits included."""
    clean, dirty = _engine(batch_invariant), _engine(batch_invariant)
    kv = dirty.engine.runner.kv
    slots = (dirty.engine.block_manager.num_blocks + 1) * kv.block_size
    kv.k[:, :, :slots] = float("nan")
    kv.v[:, :, :slots] = float("nan")
    for _ in range(2):  # the second round hits the first round's prefix blocks
        assert _outs(dirty, INNOCENT, PARAMS) == _outs(clean, INNOCENT, PARAMS)
    assert not kv.k[:, :, slots:].any() and not kv.v[:, :, slots:].any(), "the zero block was written"


@MODES
def test_stale_nan_in_every_block_a_sequence_can_get_changes_no_output(batch_invariant, one_thread):
    _stale_nan_everywhere(batch_invariant)


def test_stale_nan_changes_no_output_of_the_triton_kernels(monkeypatch, one_thread):
    # the paged prefill and decode kernels (the interpreter off CUDA) read only each sequence's own written slots
    if importlib.util.find_spec("triton") is None:  # find, not import: triton must load after TRITON_INTERPRET
        pytest.skip("triton is not installed")
    monkeypatch.setenv("MM_INFER_KERNELS", "triton")
    if not torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    _stale_nan_everywhere(False)


@MODES
@pytest.mark.parametrize("poison", [float("nan"), 3e38], ids=["nan", "3e38"])
def test_a_poisoned_request_leaves_its_batch_and_the_next_requests_bit_identical(batch_invariant, poison,
                                                                               one_thread):
    # its image comes first and it is first in line, so its NaN KV starts at block 0's slot 0; its twin (finite
    # pixels, one token) leaves the batch at the same step, so both runs schedule the same steps
    poisoned, twin = case([("image", 1, 8, 8), 20], 9), case([("image", 1, 8, 8), 20], 9)
    poisoned["multi_modal_data"]["image"].pixel_values[:] = poison
    one = SamplingParams(temperature=0.0, max_tokens=1)
    clean, dirty = _engine(batch_invariant), _engine(batch_invariant)
    expected = _outs(clean, [twin, *INNOCENT], [one, *PARAMS])
    got = _outs(dirty, [poisoned, *INNOCENT], [one, *PARAMS])
    assert got[0][2] == "error" and expected[0][2] == "length"
    assert got[1:] == expected[1:], "an innocent request in the poisoned one's batch changed"
    for _ in range(2):  # the next requests get the poisoned one's freed blocks
        assert _outs(dirty, INNOCENT, PARAMS) == _outs(clean, INNOCENT, PARAMS), "a later request changed"
