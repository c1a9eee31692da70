"""OutputStream: a lagging reader gets waiting DELTA outputs merged (CUMULATIVE: the newest), errors never merged."""

from __future__ import annotations

import asyncio

from mm_infer.engine.outputs.request_output import CompletionOutput, RequestOutput, merge_delta
from mm_infer.engine.outputs.streams import Backpressure, OutputStream
from mm_infer.engine.sampling.params import RequestOutputKind


def delta(step: int, finished: bool = False, samples: int = 2) -> RequestOutput:
    outs = [CompletionOutput(i, f"t{step}.{i}", [10 * step + i], [-float(step)], "length" if finished else None,
                             top_logprobs=[{10 * step + i: -float(step)}], cumulative_logprob=-float(step))
            for i in range(samples)]
    return RequestOutput("r", None, [1, 2], outs, finished, prompt_logprobs=[None, -1.0] if step == 0 else None)


class Group:
    held = False


def test_merge_delta_joins_each_sample_and_keeps_the_newer_state():
    merged = merge_delta(merge_delta(delta(0), delta(1)), delta(2, finished=True))
    assert [c.token_ids for c in merged.outputs] == [[0, 10, 20], [1, 11, 21]]
    assert merged.outputs[1].text == "t0.1t1.1t2.1" and merged.outputs[0].logprobs == [-0.0, -1.0, -2.0]
    assert merged.outputs[0].top_logprobs == [{0: -0.0}, {10: -1.0}, {20: -2.0}]
    assert merged.finished and merged.outputs[0].finish_reason == "length"
    assert merged.prompt_logprobs == [None, -1.0]  # sent with the first output only, kept


def test_a_sample_missing_from_the_newer_output_is_kept():
    merged = merge_delta(delta(0), delta(1, samples=1))
    assert [c.index for c in merged.outputs] == [0, 1] and merged.outputs[1].token_ids == [1]


def read_all(kind: RequestOutputKind, items: list) -> tuple[list, OutputStream, Group]:
    async def main() -> tuple[list, OutputStream, Group]:
        stream, group, policy = OutputStream(asyncio.get_running_loop(), kind), Group(), Backpressure(high=2, low=0)
        for item in items:
            stream.put(item, group, policy)
        await asyncio.sleep(0)  # the engine thread's puts land on the loop
        got = []
        while stream.behind:
            got.append((await stream.get(group, policy))[0])
        return got, stream, group

    return asyncio.run(main())


def test_a_lagging_delta_reader_gets_one_merged_output_and_an_error_stays_apart():
    error = RuntimeError("engine broke")
    got, stream, group = read_all(RequestOutputKind.DELTA, [delta(0), delta(1), delta(2), error])
    assert len(got) == 2 and got[1] is error
    assert [c.token_ids for c in got[0].outputs] == [[0, 10, 20], [1, 11, 21]]
    assert stream.taken == 4 and not group.held  # every merged output counted; the hold (set at 2 behind) released


def test_a_lagging_cumulative_reader_skips_to_the_newest_snapshot():
    got, _, _ = read_all(RequestOutputKind.CUMULATIVE, [delta(0), delta(1), delta(2)])
    assert len(got) == 1 and got[0].outputs[0].token_ids == [20]
