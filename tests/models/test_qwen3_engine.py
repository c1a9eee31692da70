"""The engine on tiny Qwen3-VL (dense and MoE): greedy ids equal HF generate, logprobs a teacher-forced HF forward."""

from __future__ import annotations

import pytest
import torch
from model_cases import REPO
from PIL import Image
from qwen3_cases import QWEN3, hf

from mm_infer import LLM, SamplingParams
from mm_infer.prompt.request import VLMRequest

MAX_NEW = 8
IMAGES, VIDEOS = REPO / "assets" / "media" / "images", REPO / "assets" / "media" / "videos"
MM = {"mm_processor_kwargs": {"backend": "pil"}}


def _prompts() -> list[dict]:
    image = Image.open(IMAGES / "photo.png").convert("RGB")
    small = Image.open(IMAGES / "tiny_9x13.png").convert("RGB")
    user = lambda *parts: [{"role": "user", "content": list(parts)}]  # noqa: E731
    text, img, vid = ({"type": "text", "text": "Describe it."}, {"type": "image"}, {"type": "video"})
    return [
        {"messages": user({"type": "text", "text": "def f(x): return x"})},
        {"messages": user(img, text), "multi_modal_data": {"image": [image]}, **MM},
        {"messages": user(img, img, text), "multi_modal_data": {"image": [image, small]}, **MM},
        {"messages": user(vid, text), "multi_modal_data": {"video": [VIDEOS / "pan_vp9_10fps.webm"]}, **MM},
        {"messages": user(img, vid, text), "multi_modal_data": {"image": [small],
                                                                "video": [VIDEOS / "odd7_h264_2fps.mp4"]}, **MM},
    ]


def _hf_kwargs(llm: LLM, req: VLMRequest, ids: list[int]) -> dict:
    cfg = llm.engine.preparer.model_config
    input_ids = torch.tensor([ids])
    types = (input_ids == cfg.image_token_id).long() + 2 * (input_ids == cfg.video_token_id).long()
    kw = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "mm_token_type_ids": types}
    for kind, key in (("image", "pixel_values"), ("video", "pixel_values_videos")):
        items = [it for it in req.items if it.modality == kind]
        if items:
            kw[key] = torch.cat([it.pixel_values for it in items])
            kw[f"{kind}_grid_thw"] = torch.tensor([list(it.grid_thw) for it in items])
    return kw


@pytest.fixture(scope="module", params=sorted(QWEN3))
def run(request):
    threads = torch.get_num_threads()
    llm = LLM(str(QWEN3[request.param]), num_kv_blocks=512, max_num_batched_tokens=4096, cpu_threads=1)
    prompts = _prompts()
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=MAX_NEW), use_tqdm=False)
    yield request.param, llm, prompts, outs
    torch.set_num_threads(threads)


@torch.inference_mode()
def test_greedy_equals_hf_generate_and_logprobs_match(run):
    kind, llm, prompts, outs = run
    cfg = llm.engine.preparer.model_config
    worst = 0.0
    for i, (prompt, out) in enumerate(zip(prompts, outs, strict=True)):
        req = llm.engine.preparer.prepare(prompt)
        assert out.prompt_token_ids == req.prompt_token_ids
        ids, got = req.prompt_token_ids, out.outputs[0].token_ids
        ref = hf(kind).generate(**_hf_kwargs(llm, req, ids), max_new_tokens=MAX_NEW, do_sample=False,
                                suppress_tokens=[cfg.image_token_id, cfg.video_token_id])[0, len(ids):].tolist()
        assert got == ref, f"{kind} prompt {i}: ours {got} != HF {ref}"
        logits = hf(kind)(**_hf_kwargs(llm, req, ids + got)).logits[0].float()  # [L, V]
        lps = torch.log_softmax(logits[len(ids) - 1:-1], dim=-1).gather(1, torch.tensor(got)[:, None])[:, 0]
        worst = max(worst, max(abs(a - b) for a, b in zip(out.outputs[0].logprobs, lps.tolist(), strict=True)))
    assert worst < 1e-4, worst
