"""HF transformers generate (float32) over a Prompt: generated ids, raw per-token logprobs and top-k alternatives."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from servers.hf_reference.prompt import BadRequest, Prompt


@dataclass(frozen=True)
class GenParams:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    top_logprobs: int = 0


@dataclass
class Generated:
    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]]
    finish_reason: str


def eos_ids(model_dir: Path, config: Any) -> list[int]:
    """The engine's stop ids: config.json's eos then generation_config.json's, de-duplicated."""
    ids: list[int] = []
    for eos in (config.get_text_config().eos_token_id,
                json.loads((model_dir / "generation_config.json").read_text()).get("eos_token_id")
                if (model_dir / "generation_config.json").exists() else None):
        ids += eos if isinstance(eos, list) else [] if eos is None else [eos]
    return list(dict.fromkeys(int(i) for i in ids))


class HFModel:
    """AutoModelForImageTextToText (Qwen2-VL family or Nemotron Omni) in float32 on CPU; one request at a time."""

    def __init__(self, model_dir: str | Path) -> None:
        from transformers import AutoModelForImageTextToText

        self.model = AutoModelForImageTextToText.from_pretrained(str(model_dir), dtype=torch.float32).eval()
        self.config = self.model.config
        self.eos = eos_ids(Path(model_dir), self.config)

    def inputs(self, prompt: Prompt) -> dict[str, Any]:
        if self.config.model_type == "nemotron_h_omni":
            return self._omni_inputs(prompt)
        ids = torch.tensor([prompt.token_ids])  # [1, L]
        types = torch.zeros_like(ids)
        types[ids == self.config.image_token_id] = 1
        types[ids == self.config.video_token_id] = 2
        kw: dict[str, Any] = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "mm_token_type_ids": types}
        if prompt.images is not None:
            kw["pixel_values"], kw["image_grid_thw"] = prompt.images.pixel_values, prompt.images.imgs_sizes
        if prompt.videos is not None:
            kw["pixel_values_videos"], kw["video_grid_thw"] = prompt.videos.pixel_values, prompt.videos.imgs_sizes
            if self.config.model_type == "qwen2_5_vl" and prompt.second_per_grid_ts:
                kw["second_per_grid_ts"] = torch.tensor(prompt.second_per_grid_ts)
        return kw

    def _omni_inputs(self, prompt: Prompt) -> dict[str, Any]:
        """Nemotron Omni: image rows + image_grid_hw, or video tubelets (one modality per request: HF's forward
        scatters both into the shared <image> token)."""
        from mm_infer.rl.trainer_inputs import omni_hf_inputs

        if prompt.request is None:
            raise ValueError("a Nemotron Omni prompt needs its prepared request")
        vision = self.config.vision_config
        try:
            return omni_hf_inputs(prompt.request, [], patch_size=int(vision.patch_size),
                                  temporal_patch_size=int(self.config.video_temporal_patch_size))
        except ValueError as exc:
            raise BadRequest(str(exc)) from exc

    @torch.inference_mode()
    def generate(self, prompt: Prompt, params: GenParams) -> Generated:
        kw = self.inputs(prompt)
        sample = params.temperature > 0
        if params.seed is not None:
            torch.manual_seed(params.seed)
        opts: dict[str, Any] = {"do_sample": sample, "max_new_tokens": params.max_tokens, "eos_token_id": self.eos,
                                "pad_token_id": self.eos[0], "output_logits": True, "return_dict_in_generate": True}
        if sample:
            opts |= {"temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k}  # 0: off
        else:
            opts |= {"temperature": None, "top_p": None, "top_k": None}
        out = self.model.generate(**kw, **opts)
        gen = out.sequences[0, kw["input_ids"].shape[1]:].tolist()
        n = next((i + 1 for i, t in enumerate(gen) if t in self.eos), len(gen))
        gen = gen[:n]
        logprobs, tops = [], []
        for step, token in enumerate(gen):
            lp = torch.log_softmax(out.logits[step][0].float(), dim=-1)  # [V] raw (unprocessed) logprobs
            logprobs.append(float(lp[token]))
            if params.top_logprobs:
                vals, idx = lp.topk(params.top_logprobs)
                tops.append([(int(i), float(v)) for i, v in zip(idx, vals, strict=True)])
        finish = "stop" if gen and gen[-1] in self.eos else "length"
        return Generated(gen, logprobs, tops, finish)
