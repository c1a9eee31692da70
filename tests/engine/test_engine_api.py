"""Public entry points: LLM.generate with real media and chat messages, AsyncEngine streams, cancel and abort."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch
from engine_cases import CKPT, CKPT25, IMAGE, REPO, VIDEO, case, hf_kwargs, hf_model

import mm_infer
from mm_infer import SamplingParams
from mm_infer.engine.async_engine import AsyncEngine
from mm_infer.engine.engine import LLMEngine
from mm_infer.media import MediaError
from mm_infer.prompt.placeholders import PromptError

IMAGES = REPO / "assets" / "media" / "images"
VIDEOS = REPO / "assets" / "media" / "videos"


def test_lazy_exports():
    assert mm_infer.LLM.__name__ == "LLM" and mm_infer.SamplingParams.__name__ == "SamplingParams"


def _as_oracle_prompt(req) -> dict:
    """The engine's own preprocessing, in the engine_cases prompt shape, for the HF oracle."""
    from mm_infer.media.packed import PackedTensor

    mm = {}
    for kind in ("image", "video"):
        items = [it for it in req.items if it.modality == kind]
        if items:
            mm[kind] = PackedTensor(torch.cat([it.pixel_values for it in items]),
                                    torch.tensor([it.grid_thw for it in items]),
                                    torch.ones(len(items), dtype=torch.long))
    return {"prompt_token_ids": req.prompt_token_ids, "multi_modal_data": mm}


def test_chat_messages_with_real_image_and_video_match_hf(llm, capsys):
    prompt = {
        "messages": [{"role": "user", "content": [
            {"type": "image"}, {"type": "text", "text": "and"}, {"type": "video"}, {"type": "text", "text": "why?"}]}],
        "multi_modal_data": {"image": [str(IMAGES / "photo_q90.jpg")],
                             "video": [(VIDEOS / "odd7_h264_2fps.mp4").read_bytes()]},
        "mm_processor_kwargs": {"max_pixels": 128 * 28 * 28, "video_max_pixels": 64 * 28 * 28, "fps": 1.0},
    }
    out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=10))[0]
    assert "Processed prompts" in capsys.readouterr().err  # tqdm progress bar
    req = llm.engine.prepare(prompt)
    assert out.prompt_token_ids == req.prompt_token_ids
    oracle = _as_oracle_prompt(req)
    ids = req.prompt_token_ids
    with torch.inference_mode():
        ref = hf_model().generate(**hf_kwargs(oracle, ids), max_new_tokens=10, do_sample=False,
                                  suppress_tokens=[IMAGE, VIDEO])[0, len(ids):].tolist()
    assert out.outputs[0].token_ids == ref
    assert isinstance(out.outputs[0].text, str) and out.outputs[0].finish_reason in ("stop", "length")


def test_media_defaults_come_from_the_checkpoint(llm):
    d = llm.engine.media_defaults
    assert (d.image_min_pixels, d.image_max_pixels, d.video_max_pixels) == (3136, 200704, 100352)


def test_bad_prompts_raise_4xx_and_queue_nothing(llm):
    with pytest.raises(PromptError, match="unknown prompt keys"):
        llm.generate([{"prompt": "hi", "images": []}], use_tqdm=False)
    with pytest.raises(PromptError, match="1 image placeholder"):
        llm.generate(["fine", {"prompt": "<|vision_start|><|image_pad|><|vision_end|>"}], use_tqdm=False)
    with pytest.raises(MediaError) as e:
        llm.generate([{"prompt": "<|vision_start|><|image_pad|><|vision_end|>",
                       "multi_modal_data": {"image": [b"not an image"]}}], use_tqdm=False)
    assert 400 <= e.value.status < 500
    assert not llm.engine.has_unfinished()


def test_qwen25_video_and_image_match_hf():
    threads = torch.get_num_threads()
    try:
        llm = mm_infer.LLM(str(CKPT25), num_kv_blocks=256, cpu_threads=1)
        prompt = case([4, ("image", 1, 4, 6), 3, ("video", 4, 4, 4), 5], seed=50)
        prompt["mm_processor_kwargs"] = {"fps": 1.0}  # second_per_grid_ts = temporal_patch / fps = 2.0
        out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=10), use_tqdm=False)[0]
        ids = out.prompt_token_ids
        kw = hf_kwargs(prompt, ids) | {"second_per_grid_ts": torch.tensor([2.0])}
        with torch.inference_mode():
            ref = hf_model(CKPT25).generate(**kw, max_new_tokens=10, do_sample=False,
                                            suppress_tokens=[IMAGE, VIDEO])[0, len(ids):].tolist()
    finally:
        torch.set_num_threads(threads)
    assert out.outputs[0].token_ids == ref


@pytest.fixture(scope="module")
def async_engine():
    threads = torch.get_num_threads()
    engine = AsyncEngine(LLMEngine.from_options(str(CKPT), num_kv_blocks=256, cpu_threads=1, batch_invariant=True))
    yield engine
    engine.shutdown()
    torch.set_num_threads(threads)


def test_async_streams_match_offline(async_engine, llm):
    prompts = [case([5, ("image", 1, 4, 4), 6], seed=60), case([17], seed=61)]
    params = SamplingParams(temperature=0.0, max_tokens=6)
    offline = llm.generate(prompts, params, use_tqdm=False)

    async def collect(prompt):
        return [out async for out in async_engine.generate(prompt, params)]

    async def main():
        return await asyncio.gather(*(collect(p) for p in prompts))

    for snaps, ref in zip(asyncio.run(main()), offline, strict=True):
        assert snaps[-1].finished and not any(s.finished for s in snaps[:-1])
        lengths = [len(s.outputs[0].token_ids) for s in snaps]  # a reader that lags skips to the newest snapshot
        assert lengths == sorted(set(lengths)) and lengths[0] >= 1
        assert snaps[-1].outputs[0].token_ids == ref.outputs[0].token_ids
        assert snaps[-1].outputs[0].logprobs == ref.outputs[0].logprobs


def test_async_cancel_aborts_and_explicit_abort_reports(async_engine):
    long = SamplingParams(temperature=0.0, max_tokens=500, ignore_eos=True)

    async def cancel_after_three():
        seen = 0
        async for _ in async_engine.generate(case([8], seed=70), long, request_id="cancel-me"):
            seen += 1
            if seen == 3:
                break  # closing the stream aborts the request
        return seen

    async def abort_midway():
        outs = []
        async for out in async_engine.generate(case([8], seed=71), long, request_id="abort-me"):
            outs.append(out)
            if len(outs) == 2:
                async_engine.abort("abort-me")
        return outs

    assert asyncio.run(cancel_after_three()) == 3
    outs = asyncio.run(abort_midway())
    final = outs[-1]
    assert final.finished and final.outputs[0].finish_reason == "abort"
    tokens = final.outputs[0].token_ids
    assert 2 <= len(tokens) < 500 and len(final.outputs[0].logprobs) == len(tokens)
    deadline = time.time() + 5
    while async_engine.core.has_unfinished() and time.time() < deadline:
        time.sleep(0.01)
    bm = async_engine.core.block_manager
    assert not async_engine.core.has_unfinished() and bm.num_free_blocks == bm.num_blocks


def test_async_generate_on_a_stopped_engine_fails_instead_of_hanging(llm):
    stopped = AsyncEngine(llm.engine)
    assert stopped.is_alive
    stopped.shutdown()
    assert not stopped.is_alive

    async def first():
        async for out in stopped.generate(case([4], seed=80), SamplingParams(max_tokens=2)):
            return out

    with pytest.raises(RuntimeError, match="not running"):
        asyncio.run(asyncio.wait_for(first(), timeout=10))


def test_control_calls_are_not_starved_by_a_busy_loop(async_engine):
    """The step lock is handed to abort / run_locked between steps, however busy the engine is."""
    long = SamplingParams(temperature=0.0, max_tokens=3000, ignore_eos=True)

    def generated() -> int:
        group = async_engine.core.groups.get("busy")
        return -1 if group is None else len(group.seqs[0].token_ids)

    async def busy_then_control():
        stream = async_engine.generate(case([8], seed=72), long, request_id="busy")
        await stream.__anext__()
        grew = []  # tokens generated while a control call waited for the lock: counted in steps, not seconds
        for _ in range(5):
            before = generated()
            grew.append(async_engine.run_locked(generated) - before)
        async_engine.abort("busy")
        last = None
        async for out in stream:
            last = out
        return grew, last

    grew, last = asyncio.run(busy_then_control())
    # fair hand-off: the step under way lands, then the call runs (one token; a few more if this thread is descheduled
    # between reading the count and asking for the lock). A starved call waited for the loop to go idle: 3000.
    assert all(0 <= g <= 50 for g in grew), f"control calls waited for {grew} steps of the busy loop"
    assert last.outputs[0].finish_reason == "abort" and len(last.outputs[0].token_ids) < 3000


def test_final_only_requests_get_one_output_equal_to_the_streamed_final(async_engine):
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)

    async def both():
        async def collect(seed: int, stream: bool):
            return [o async for o in async_engine.generate(case([8], seed=seed), params, f"fo-{seed}-{stream}",
                                                           stream=stream)]

        alone = await collect(80, False)  # no stream open: steps build no snapshots
        mixed = await asyncio.gather(collect(81, False), collect(81, True))
        return alone, mixed

    alone, (final_only, streamed) = asyncio.run(both())
    assert len(alone) == 1 and alone[0].finished and len(alone[0].outputs[0].token_ids) == 12
    assert len(final_only) == 1 and final_only[0].finished
    # A CUMULATIVE stream gives a reader that lags only the newest output (they coalesce, by design), so the number
    # of outputs is anything from 1 to 12; what is promised: each is a growing prefix of the final, only the last
    # one is finished, and it equals the final-only output.
    final = streamed[-1].outputs[0]
    assert 1 <= len(streamed) <= 12 and [o.finished for o in streamed] == [False] * (len(streamed) - 1) + [True]
    lengths = [len(o.outputs[0].token_ids) for o in streamed]
    assert lengths == sorted(set(lengths)) and lengths[-1] == 12
    for o in streamed:
        n = len(o.outputs[0].token_ids)
        assert o.outputs[0].token_ids == final.token_ids[:n] and o.outputs[0].logprobs == final.logprobs[:n]
    assert final_only[0].outputs[0].token_ids == final.token_ids
    assert final_only[0].outputs[0].logprobs == final.logprobs
