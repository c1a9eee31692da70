"""Shared pieces of the weight-transfer tests: the trainer process, an image question, the HF greedy oracle."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import httpx
import torch

from mm_infer.rl import hf_inputs

REPO = Path(__file__).resolve().parents[2]
CKPT = REPO / "assets" / "models" / "tiny-qwen2-vl"
IMAGE = REPO / "assets" / "media" / "images" / "photo_q90.jpg"
TRAINER = Path(__file__).with_name("transfer_trainer.py")
SMALL = 12544  # max_pixels: at most 16 patches
N = 6
QUESTION = "What colour is it?"


def run_trainer(base_url: str, out_dir: Path, *extra: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    """The trainer in its own process: perturbs the tiny model, saves it to out_dir, broadcasts it."""
    return subprocess.run([sys.executable, str(TRAINER), base_url, str(out_dir), *extra], capture_output=True,
                          text=True, timeout=timeout_s, cwd=REPO)


def report(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def image_prompt() -> dict:
    return {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}],
            "multi_modal_data": {"image": [IMAGE]}, "mm_processor_kwargs": {"max_pixels": SMALL}}


def ask(base_url: str, model: str = CKPT.name) -> tuple[list[int], int]:
    """Greedy token ids of the image question over HTTP, and the weight version that produced them."""
    url = f"data:image/jpeg;base64,{base64.b64encode(IMAGE.read_bytes()).decode()}"
    content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": QUESTION}]
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": N, "min_tokens": N,
            "temperature": 0.0, "return_token_ids": True, "mm_processor_kwargs": {"max_pixels": SMALL}}
    r = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    out = r.json()
    return out["choices"][0]["token_ids"], out["weight_version"]


@torch.no_grad()
def hf_greedy(model_dir: Path, preparer) -> list[int]:
    """HF transformers generate on the image question with the weights saved in model_dir."""
    from transformers import AutoModelForImageTextToText

    hf = AutoModelForImageTextToText.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    ids = preparer.placeholder_ids
    request = preparer.prepare(image_prompt())
    kw = hf_inputs(request, [], image_pad_id=ids.image_pad_id, video_pad_id=ids.video_pad_id)
    out = hf.generate(**kw, max_new_tokens=N, min_new_tokens=N, do_sample=False,
                      suppress_tokens=[ids.image_pad_id, ids.video_pad_id])
    return out[0, len(request.prompt_token_ids):].tolist()
