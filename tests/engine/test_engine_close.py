"""LLM.close() (and `with LLM(...)`) releases the KV pool, the decode buffers and the weights at once: no reference
cycle keeps them until a garbage collection, so engines built one after another never share a device's memory."""

from __future__ import annotations

import gc
import weakref

from engine_cases import CKPT

from mm_infer import LLM, SamplingParams


def test_close_frees_the_kv_pool_decode_buffers_and_weights_without_a_collection():
    gc.disable()
    try:
        with LLM(str(CKPT), num_kv_blocks=64, cpu_threads=1) as llm:
            out = llm.generate([{"prompt": "hello there"}], SamplingParams(max_tokens=4, ignore_eos=True),
                               use_tqdm=False)
            assert len(out[0].outputs[0].token_ids) == 4
            runner = llm.engine.runner
            held = [weakref.ref(t) for t in (runner.kv.k, runner.kv.v, llm.engine.model.lm_head.weight,
                                             *(b.ids for b in runner.graphs.buffers.values()))]
            assert len(held) >= 4 and all(ref() is not None for ref in held)
        assert [ref() is None for ref in held] == [True] * len(held)  # freed by the close, not by gc
    finally:
        gc.enable()
