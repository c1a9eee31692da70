"""Fixed generation cases whose outputs are recorded once (`python tests/engine/recorded_cases.py`) and replayed.

A refactor must keep every recorded token id, text, finish and stop reason exactly and every logprob within the
bound `test_recorded_outputs.py` states (the recording was made on another CPU: DESIGN.md, "Portable exactness").
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
RECORD = Path(__file__).with_name("recorded_outputs.json")
SHAPES = REPO / "assets" / "media" / "shapes"
VIDEOS = REPO / "assets" / "media" / "videos"
MODELS = {"qwen2": REPO / "assets" / "models" / "tiny-qwen2-vl",
          "qwen25": REPO / "assets" / "models" / "tiny-qwen2.5-vl"}


def _chat(text: str, *media: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [*({"type": m} for m in media), {"type": "text", "text": text}]}]


def cases() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(name, prompt, sampling options); one LLM.generate batch per model runs them all together."""
    image = str(SHAPES / "colour_example.png")
    count = str(SHAPES / "count_example.png")
    video = str(VIDEOS / "odd7_h264_2fps.mp4")
    return [
        ("text_greedy", {"prompt": "The quick brown fox"}, {"temperature": 0.0, "max_tokens": 24, "ignore_eos": True}),
        ("image_greedy", {"messages": _chat("What colour?", "image"), "multi_modal_data": {"image": [image]}},
         {"temperature": 0.0, "max_tokens": 20, "ignore_eos": True, "logprobs": 3}),
        ("two_images_sampled", {"messages": _chat("Compare.", "image", "image"),
                                "multi_modal_data": {"image": [image, count]}},
         {"n": 3, "temperature": 1.0, "top_p": 0.9, "seed": 11, "max_tokens": 16, "ignore_eos": True}),
        # recorded under the old default frame rule, qwen-vl-utils' (issue 21 made HF's the default)
        ("video_greedy", {"messages": _chat("What moves?", "video"), "multi_modal_data": {"video": [video]},
                          "mm_processor_kwargs": {"fps": 2.0, "sampler": "qwen"}},
         {"temperature": 0.0, "max_tokens": 12, "ignore_eos": True}),
        ("image_and_video", {"messages": _chat("Both?", "image", "video"),
                             "multi_modal_data": {"image": [count], "video": [video]},
                             "mm_processor_kwargs": {"sampler": "qwen"}},
         {"n": 2, "temperature": 0.8, "top_k": 20, "seed": 3, "max_tokens": 10, "ignore_eos": True}),
        ("stop_string", {"prompt": "one two three"}, {"temperature": 1.0, "seed": 5, "max_tokens": 40,
                                                     "stop": ["e", "th"], "ignore_eos": True}),
        ("prompt_logprobs", {"prompt": "Score these prompt tokens"},
         {"temperature": 0.0, "max_tokens": 4, "prompt_logprobs": 2, "ignore_eos": True}),
    ]


def run(model: str, mutate: Callable[[Any], None] | None = None) -> dict[str, Any]:
    """Generate every case on one tiny checkpoint; floats are kept as repr strings (bit-exact round trip).
    `mutate(model)` changes the loaded weights or layers first (the tests that show the guard can fail)."""
    from mm_infer import LLM, SamplingParams

    llm = LLM(str(MODELS[model]), batch_invariant=True)  # the numbers of any batch composition
    if mutate is not None:
        mutate(llm.engine.model)
    named = cases()
    outs = llm.generate([p for _, p, _ in named], [SamplingParams(**s) for _, _, s in named], use_tqdm=False)
    record: dict[str, Any] = {}
    for (name, _, _), out in zip(named, outs, strict=True):
        record[name] = {
            "prompt_token_ids": out.prompt_token_ids,
            "prompt_logprobs": None if out.prompt_logprobs is None else [repr(x) for x in out.prompt_logprobs],
            "samples": [{"token_ids": c.token_ids, "logprobs": [repr(x) for x in c.logprobs], "text": c.text,
                         "finish_reason": c.finish_reason, "stop_reason": c.stop_reason,
                         "top_logprobs": None if c.top_logprobs is None else
                         [{str(k): repr(v) for k, v in t.items()} for t in c.top_logprobs]}
                        for c in out.outputs],
        }
    return record


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    RECORD.write_text(json.dumps({m: run(m) for m in MODELS}, indent=1) + "\n")
    print(f"wrote {RECORD}")
