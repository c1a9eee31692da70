"""PromptFrontend: tokenizer, placeholder ids and media defaults of a checkpoint; prompts -> VLMRequest, no weights."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mm_infer.config import MediaConfig
from mm_infer.engine.inputs import MediaDefaults, media_defaults, prepare_request
from mm_infer.engine.request import VLMRequest
from mm_infer.engine.tokenizer import Tokenizer
from mm_infer.models.config import ModelConfig, load_config
from mm_infer.prompt.placeholders import PlaceholderIds


class PromptFrontend:
    """Everything prepare() needs, loadable without the model: the engine owns one, and so does a router process."""

    def __init__(self, model_dir: str | Path, media: MediaConfig | None = None, tokenizer: Any = None,
                 model_config: ModelConfig | None = None) -> None:
        self.model_dir = Path(model_dir)
        self.model_config = model_config or load_config(self.model_dir)
        mcfg = self.model_config
        self.tokenizer = tokenizer if tokenizer is not None else Tokenizer.from_pretrained(self.model_dir)
        self.placeholder_ids = PlaceholderIds(mcfg.image_token_id, mcfg.video_token_id,
                                              mcfg.vision_start_token_id, mcfg.vision_end_token_id)
        self.merge_size = mcfg.vision.spatial_merge_size
        self.tokens_per_second = mcfg.vision.tokens_per_second if mcfg.kind == "qwen2_5_vl" else None
        self.media_defaults: MediaDefaults = media_defaults(self.model_dir, media or MediaConfig())

    def prepare(self, prompt: str | Mapping[str, Any]) -> VLMRequest:
        """Tokenise, preprocess media and expand placeholders (PromptError / MediaError on bad input)."""
        return prepare_request(prompt, self.tokenizer, self.placeholder_ids, self.media_defaults,
                               merge_size=self.merge_size, tokens_per_second=self.tokens_per_second)
