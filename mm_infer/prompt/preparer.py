"""PromptPreparer: the one entry from a prompt (str, dict or PromptInput) to a VLMRequest, loadable without weights."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from mm_infer.config import MediaConfig
from mm_infer.media.frame_sampling import timestamp_text
from mm_infer.media.omni_audio import AUDIO_END, AUDIO_START, AUDIO_TOKEN
from mm_infer.models.config import ModelConfig, load_config
from mm_infer.prompt.audio import audio_refusal
from mm_infer.prompt.chat_prompt import ChatPrompt, TemplateOptions, chat_token_ids
from mm_infer.prompt.inputs import PromptInput, parse_prompt
from mm_infer.prompt.media import MediaDefaults, media_defaults
from mm_infer.prompt.mrope import mrope_from_placeholders
from mm_infer.prompt.omni_placeholders import OmniText, OmniTokens, check_pruning, expand_omni, flat_positions
from mm_infer.prompt.placeholders import FramedVideo, PlaceholderIds, PromptError, expand_placeholders
from mm_infer.prompt.request import VLMRequest
from mm_infer.prompt.templating import ChatRenderer, flat_token_ids, media_token_text
from mm_infer.prompt.tokenizer import Tokenizer

Prompt = str | Mapping[str, Any] | PromptInput | VLMRequest  # the one prompt type: text, dict, typed, prepared


def render_prompt(renderer: ChatRenderer | Any, *, prompt: str | None = None,
                  prompt_token_ids: Sequence[int] | None = None,
                  messages: Sequence[Mapping[str, Any]] | None = None,
                  chat_template_kwargs: Mapping[str, Any] | None = None) -> list[int]:
    """Exactly one of prompt / prompt_token_ids / messages -> token ids (placeholders not yet expanded).

    `renderer` is a ChatRenderer, or a bare tokenizer (rendered through a ChatRenderer without fallback media)."""
    if not isinstance(renderer, ChatRenderer):
        renderer = ChatRenderer(renderer, {})
    given = PromptInput(text=prompt, token_ids=prompt_token_ids, messages=messages)  # checks exactly one
    if given.token_ids is not None:
        ids = [int(t) for t in given.token_ids]
    elif given.text is not None:
        ids = flat_token_ids(renderer.tokenizer.encode(given.text))
    else:
        kwargs = dict(chat_template_kwargs or {})  # the library lets these options ride in the kwargs
        options = TemplateOptions(add_generation_prompt=bool(kwargs.pop("add_generation_prompt", True)),
                                  continue_final_message=bool(kwargs.pop("continue_final_message", False)),
                                  tools=kwargs.pop("tools", None), chat_template_kwargs=kwargs)
        ids = chat_token_ids(ChatPrompt(list(given.messages or []), options), renderer)
    if not ids:
        raise PromptError("the prompt is empty")
    return ids


def build_request(renderer: ChatRenderer | Any, ids: PlaceholderIds, prompt: PromptInput, *, merge_size: int = 2,
                  tokens_per_second: float | None = None, mrope_after_video: str = "hf") -> VLMRequest:
    """Render (or take) the ids, expand or check each item's placeholder run, and place M-RoPE from the runs."""
    renderer = renderer if isinstance(renderer, ChatRenderer) else ChatRenderer(renderer, {})
    raw = render_prompt(renderer, prompt=prompt.text, prompt_token_ids=prompt.token_ids, messages=prompt.messages,
                        chat_template_kwargs=prompt.chat_template_kwargs)
    images, videos = list(prompt.images), list(prompt.videos)
    frames = [None if it.timestamps is None else  # Qwen3-VL: "<t seconds>" before each temporal patch
              FramedVideo(tuple(tuple(renderer.encode(timestamp_text(t))) for t in it.timestamps)) for it in videos]
    token_ids, ranges, order = expand_placeholders(
        raw, ids, image_tokens=[it.num_tokens(merge_size) for it in images],
        video_tokens=[it.num_tokens(merge_size) for it in videos],
        image_hashes=[it.content_hash for it in images], video_hashes=[it.content_hash for it in videos],
        preexpanded=prompt.media_tokens_preexpanded, video_frames=frames)
    by_kind = {"image": images, "video": videos}
    items = [by_kind[modality][k] for modality, k in order]
    positions, delta = mrope_from_placeholders(len(token_ids), ranges, items, merge_size, tokens_per_second,
                                               mrope_after_video)
    return VLMRequest(token_ids, ranges, items, positions.to(torch.long), delta, prompt.text, prompt.cache_salt)


def build_omni_request(renderer: ChatRenderer | Any, tok: OmniTokens, prompt: PromptInput, *, merge_size: int = 2,
                       temporal_patch: int = 2, video_pruning_rate: float = 0.0) -> VLMRequest:
    """Nemotron Omni: render (or take) the ids, expand or check its <image> / <video> / <so_embedding> markers as
    HF's processor does; no RoPE, so positions are the plain sequence."""
    renderer = renderer if isinstance(renderer, ChatRenderer) else ChatRenderer(renderer, {})
    check_pruning(prompt.videos, video_pruning_rate)
    raw = render_prompt(renderer, prompt=prompt.text, prompt_token_ids=prompt.token_ids, messages=prompt.messages,
                        chat_template_kwargs=prompt.chat_template_kwargs)
    token_ids, ranges, order = expand_omni(raw, tok, OmniText.of(renderer.tokenizer), prompt.images, prompt.videos,
                                           merge=merge_size, temporal_patch=temporal_patch,
                                           preexpanded=prompt.media_tokens_preexpanded, audios=prompt.audios)
    by_kind = {"image": list(prompt.images), "video": list(prompt.videos), "audio": list(prompt.audios)}
    positions, delta = flat_positions(len(token_ids))
    return VLMRequest(token_ids, ranges, [by_kind[m][k] for m, k in order], positions, delta, prompt.text,
                      prompt.cache_salt)


class PromptPreparer:
    """Tokenizer, chat renderer, placeholder ids and media defaults of one checkpoint: prompts -> VLMRequest."""

    def __init__(self, model_dir: str | Path, media: MediaConfig | None = None, tokenizer: Any = None,
                 model_config: ModelConfig | None = None) -> None:
        self.model_dir = Path(model_dir)
        mcfg = model_config or load_config(self.model_dir)
        self.model_config = mcfg
        self.tokenizer = tokenizer if tokenizer is not None else Tokenizer.from_pretrained(self.model_dir)
        self.placeholder_ids = PlaceholderIds(mcfg.image_token_id, mcfg.video_token_id,
                                              mcfg.vision_start_token_id, mcfg.vision_end_token_id)
        self.audio_tower = mcfg.omni is not None and mcfg.omni.audio is not None
        self.omni = self._omni_tokens(mcfg) if mcfg.kind == "nemotron_h_omni" else None
        media_text = (media_token_text(self.tokenizer, self.placeholder_ids) if self.omni is None else
                      {"image": self.tokenizer.decode([self.omni.image]),
                       "video": self.tokenizer.decode([self.omni.video])})  # Omni: bare markers, HF expands them
        if self.omni is not None and self.audio_tower and self.omni.audio is not None:
            media_text["audio"] = self.tokenizer.decode([self.omni.audio])
        self.renderer = ChatRenderer(self.tokenizer, media_text)
        self.merge_size = mcfg.vision.spatial_merge_size
        self.tokens_per_second = mcfg.vision.tokens_per_second if mcfg.kind == "qwen2_5_vl" else None
        media = media or MediaConfig()
        self.mrope_after_video = media.mrope_after_video
        self.media_defaults: MediaDefaults = media_defaults(self.model_dir, media, audio_tower=self.audio_tower)

    def _omni_tokens(self, mcfg: ModelConfig) -> OmniTokens:
        """The Omni markers' ids; with an audio tower the audio ones, from the config (sound_context_token_id) or
        the tokenizer."""
        def tid(token: str) -> int | None:
            found = self.tokenizer.convert_tokens_to_ids(token)
            return None if found is None or found == getattr(self.tokenizer, "unk_token_id", None) else int(found)

        base = (mcfg.image_token_id, mcfg.video_token_id, mcfg.vision_start_token_id, mcfg.vision_end_token_id)
        if not self.audio_tower:  # <so_embedding> stays plain text, as HF's processor leaves it without audio
            return OmniTokens(*base)
        audio = getattr(mcfg.omni, "audio_token_id", None)
        return OmniTokens(*base, audio if audio is not None else tid(AUDIO_TOKEN), tid(AUDIO_START), tid(AUDIO_END))

    def parse(self, prompt: str | Mapping[str, Any]) -> PromptInput:
        """A prompt str or dict -> PromptInput, media decoded with this checkpoint's defaults."""
        return parse_prompt(prompt, self.media_defaults)

    def prepare(self, prompt: Prompt) -> VLMRequest:
        """Tokenise, preprocess media and expand placeholders (PromptError / MediaError on bad input); a prepared
        request (render -> generate, a replica's or the core's input) is returned as it is."""
        if isinstance(prompt, VLMRequest):
            return prompt
        typed = prompt if isinstance(prompt, PromptInput) else self.parse(prompt)
        if typed.audios and not self.audio_tower:
            raise audio_refusal(f"{self.model_dir.name} ({self.model_config.kind})")
        if self.omni is not None:
            omni = self.model_config.omni
            return build_omni_request(self.renderer, self.omni, typed, merge_size=self.merge_size,
                                      temporal_patch=self.model_config.vision.temporal_patch_size,
                                      video_pruning_rate=float(getattr(omni, "video_pruning_rate", 0.0) or 0.0))
        return build_request(self.renderer, self.placeholder_ids, typed, merge_size=self.merge_size,
                             tokens_per_second=self.tokens_per_second, mrope_after_video=self.mrope_after_video)
