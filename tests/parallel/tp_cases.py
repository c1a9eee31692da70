"""Shared pieces of the tensor-parallel tests: prompts with text, a real image and a real video, greedy sampling
with every kind of logprob, and the largest logprob gap between two runs' outputs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mm_infer import SamplingParams
from mm_infer.engine.outputs.request_output import RequestOutput

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "assets" / "models"
IMAGE = REPO / "assets" / "media" / "images" / "photo_q90.jpg"
VIDEO = REPO / "assets" / "media" / "videos" / "odd7_h264_2fps.mp4"
SMALL = {"max_pixels": 64 * 32 * 32, "video_max_pixels": 32 * 32 * 32, "fps": 1.0}
GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=5, prompt_logprobs=3)
# one process per rank, each on its share of the cores; small pools keep start-up quick
ENGINE = {"num_kv_blocks": 96, "max_model_len": 1024, "cpu_threads": 1}


def _chat(text: str, *media: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [*({"type": m} for m in media), {"type": "text", "text": text}]}]


def prompts() -> list[dict[str, Any]]:
    """Text, image, video, and image + video in one prompt."""
    return [{"prompt": "The quick brown fox jumps over"},
            {"messages": _chat("What is in the picture?", "image"), "multi_modal_data": {"image": [str(IMAGE)]},
             "mm_processor_kwargs": SMALL},
            {"messages": _chat("What moves?", "video"), "multi_modal_data": {"video": [str(VIDEO)]},
             "mm_processor_kwargs": SMALL},
            {"messages": _chat("Both?", "image", "video"),
             "multi_modal_data": {"image": [str(IMAGE)], "video": [str(VIDEO)]}, "mm_processor_kwargs": SMALL}]


def _entries(out: RequestOutput) -> list[tuple[tuple, float]]:
    """(where, logprob) of every logprob an output carries: sampled tokens, their top-k, prompt tokens and theirs."""
    got = []
    for i, sample in enumerate(out.outputs):
        got += [(("lp", i, t), v) for t, v in enumerate(sample.logprobs)]
        for t, top in enumerate(sample.top_logprobs or []):
            got += [(("top", i, t, tok), v) for tok, v in top.items()]
    got += [(("prompt", t), v) for t, v in enumerate(out.prompt_logprobs or []) if v is not None]
    for t, top in enumerate(out.prompt_top_logprobs or []):
        got += [(("prompt top", t, tok), v) for tok, v in (top or {}).items()]
    return got


def token_ids(outs: list[RequestOutput]) -> list[list[list[int]]]:
    return [[list(s.token_ids) for s in o.outputs] for o in outs]


def max_logprob_gap(a: list[RequestOutput], b: list[RequestOutput]) -> float:
    """The largest |difference| between the same logprob in two runs (both must carry the same entries)."""
    gap = 0.0
    for x, y in zip(a, b, strict=True):
        ex, ey = dict(_entries(x)), dict(_entries(y))
        assert ex.keys() == ey.keys(), "the two runs returned different logprob entries"
        gap = max([gap, *(abs(ex[k] - ey[k]) for k in ex)])
    return gap
