"""Samples to model inputs: chat-templated prompt ids with expanded media pads, answer labels, packed pixels."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mm_infer.config import MediaConfig
from mm_infer.data.tasks import Sample
from mm_infer.media import PackedTensor, preprocess_images, preprocess_videos
from mm_infer.prompt.media import MediaDefaults, media_defaults

IGNORE = -100
PAD_TOKEN = {"image": "<|image_pad|>", "video": "<|video_pad|>"}
MM_TYPE = {"image": 1, "video": 2}


@dataclass
class Example:
    """One tokenised sample: expanded prompt ids, answer ids (ending in <|im_end|>) and its media."""

    prompt_ids: list[int]
    answer_ids: list[int]
    modality: str
    media: PackedTensor
    pad_id: int  # the <|image_pad|> or <|video_pad|> id

    @property
    def input_ids(self) -> list[int]:
        return self.prompt_ids + self.answer_ids

    @property
    def labels(self) -> list[int]:
        return [IGNORE] * len(self.prompt_ids) + self.answer_ids

    @property
    def mm_token_type_ids(self) -> list[int]:
        return [MM_TYPE[self.modality] if t == self.pad_id else 0 for t in self.input_ids]


def messages(sample: Sample) -> list[dict[str, Any]]:
    """The user turn as chat content parts: the media placeholder, then the question."""
    return [{"role": "user", "content": [{"type": sample.modality}, {"type": "text", "text": sample.question}]}]


class ChatEncoder:
    """Renders samples with a checkpoint's tokenizer, chat template and preprocessing defaults."""

    def __init__(self, tokenizer: Any, defaults: MediaDefaults, merge_size: int = 2) -> None:
        self.tokenizer = tokenizer
        self.defaults = defaults
        self.merge = merge_size
        self.pad_ids = {k: tokenizer.convert_tokens_to_ids(v) for k, v in PAD_TOKEN.items()}
        self.end_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self._templates: dict[tuple[str, str], list[int]] = {}

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> ChatEncoder:
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(str(model_dir)), media_defaults(model_dir, MediaConfig()))

    def pixels(self, sample: Sample) -> PackedTensor:
        """The sample's media through mm_infer.media with the checkpoint's min/max pixels and fps."""
        d = self.defaults
        if sample.modality == "image":
            return preprocess_images([sample.media], min_pixels=d.image_min_pixels, max_pixels=d.image_max_pixels)
        packed, _ = preprocess_videos([sample.media], fps=d.video_fps, min_pixels=d.video_min_pixels,
                                      max_pixels=d.video_max_pixels)
        return packed

    def template_ids(self, sample: Sample) -> list[int]:
        """Prompt ids with a single media pad, as the chat template renders them with a generation prompt."""
        key = (sample.modality, sample.question)
        if key not in self._templates:
            text = self.tokenizer.apply_chat_template(messages(sample), add_generation_prompt=True, tokenize=False)
            self._templates[key] = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return self._templates[key]

    def encode(self, sample: Sample) -> Example:
        media = self.pixels(sample)
        n = media.tokens_per_item(self.merge)[0]
        pad = self.pad_ids[sample.modality]
        prompt: list[int] = []
        for t in self.template_ids(sample):
            prompt += [t] * n if t == pad else [t]
        answer = self.tokenizer(sample.answer, add_special_tokens=False)["input_ids"] + [self.end_id]
        return Example(prompt, answer, sample.modality, media, pad)

    def decode_answer(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True).strip()
