"""Three ways to answer samples greedily: HF transformers (the reference), mm_infer.LLM, an OpenAI chat server."""

from __future__ import annotations

import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mm_infer.data.chat import ChatEncoder, messages
from mm_infer.data.media_urls import image_url, video_url
from mm_infer.data.tasks import Sample


@dataclass(frozen=True)
class Answer:
    text: str
    token_ids: list[int] | None  # None when the backend does not return them


def normalize(text: str) -> str:
    return text.strip().strip(".!").strip().lower()


class HFAnswerer:
    """transformers generate over the same expanded ids and mm_infer.media pixels the engine uses."""

    def __init__(self, model_dir: str | Path) -> None:
        from transformers import AutoModelForImageTextToText

        self.enc = ChatEncoder.from_dir(model_dir)
        self.model = AutoModelForImageTextToText.from_pretrained(str(model_dir), dtype=torch.float32).eval()

    @torch.inference_mode()
    def answer_one(self, sample: Sample, max_tokens: int) -> Answer:
        ex = self.enc.encode(sample)
        ids = torch.tensor([ex.prompt_ids])
        types = torch.tensor([ex.mm_token_type_ids[: len(ex.prompt_ids)]])
        kw: dict[str, Any] = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "mm_token_type_ids": types}
        prefix = "" if sample.modality == "image" else "_videos"
        kw[f"pixel_values{prefix}"] = ex.media.pixel_values
        kw[f"{sample.modality}_grid_thw"] = ex.media.imgs_sizes
        out = self.model.generate(**kw, max_new_tokens=max_tokens, do_sample=False)[0, ids.shape[1]:].tolist()
        eos = set(self.model.generation_config.eos_token_id or [])
        gen = out[: next((i + 1 for i, t in enumerate(out) if t in eos), len(out))]
        return Answer(self.enc.decode_answer(gen), gen)

    def answer(self, samples: list[Sample], max_tokens: int) -> list[Answer]:
        return [self.answer_one(s, max_tokens) for s in samples]


def engine_prompt(sample: Sample) -> dict[str, Any]:
    """The vLLM-style prompt dict for mm_infer.LLM.generate: chat messages plus raw pixels / frames."""
    return {"messages": messages(sample), "multi_modal_data": {sample.modality: [sample.media]}}


class OfflineAnswerer:
    """mm_infer.LLM.generate with greedy SamplingParams, all samples in one call (continuous batching)."""

    def __init__(self, model_dir: str | Path, **engine_options: Any) -> None:
        from mm_infer import LLM

        self.llm = LLM(str(model_dir), **engine_options)

    def answer(self, samples: list[Sample], max_tokens: int) -> list[Answer]:
        from mm_infer import SamplingParams

        outs = self.llm.generate([engine_prompt(s) for s in samples],
                                 SamplingParams(temperature=0.0, max_tokens=max_tokens), use_tqdm=False)
        return [Answer(o.outputs[0].text.strip(), list(o.outputs[0].token_ids)) for o in outs]


def chat_request(sample: Sample, model: str, max_tokens: int) -> dict[str, Any]:
    """An OpenAI chat request: the image as a PNG data URL, the video as a lossless QuickTime data URL."""
    if sample.modality == "image":
        media = {"type": "image_url", "image_url": {"url": image_url(sample.media)}}
    else:
        media = {"type": "video_url", "video_url": {"url": video_url(sample.media)}}
    content = [media, {"type": "text", "text": sample.question}]
    return {"model": model, "messages": [{"role": "user", "content": content}], "temperature": 0.0,
            "max_tokens": max_tokens}


class OpenAIAnswerer:
    """POST /v1/chat/completions, a few requests in flight so the server batches them."""

    def __init__(self, url: str, model: str | None = None, api_key: str | None = None, concurrency: int = 8,
                 timeout: float = 120.0) -> None:
        self.base = url.rstrip("/").removesuffix("/v1")
        auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.headers = {"Content-Type": "application/json"} | auth
        self.timeout, self.concurrency = timeout, concurrency
        self.model = model or self._get("/v1/models")["data"][0]["id"]

    def _get(self, path: str) -> dict[str, Any]:
        req = urllib.request.Request(self.base + path, headers=self.headers)
        with urllib.request.urlopen(req, timeout=self.timeout) as resp:
            return json.loads(resp.read())

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        req = urllib.request.Request(self.base + path, data=json.dumps(body).encode(), headers=self.headers)
        with urllib.request.urlopen(req, timeout=self.timeout) as resp:
            return json.loads(resp.read())

    def answer_one(self, sample: Sample, max_tokens: int) -> Answer:
        choice = self._post("/v1/chat/completions", chat_request(sample, self.model, max_tokens))["choices"][0]
        ids = choice.get("token_ids") or choice["message"].get("generation_token_ids")  # mm-infer's RL fields
        return Answer((choice["message"].get("content") or "").strip(), list(ids) if ids is not None else None)

    def answer(self, samples: list[Sample], max_tokens: int) -> list[Answer]:
        with ThreadPoolExecutor(self.concurrency) as pool:
            return list(pool.map(lambda s: self.answer_one(s, max_tokens), samples))
