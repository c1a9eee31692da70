"""ServerConfig: everything `mm-infer serve` decides at start-up (frozen)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mm_infer.prompt.template_workers import TemplateLimits


@dataclass(frozen=True)
class FetchConfig:
    """Where media may come from, and how much of it."""

    allowed_media_paths: tuple[Path, ...] = ()
    allow_private_urls: bool = False  # http(s) to loopback / private / link-local addresses
    allow_remote_urls: bool = True
    timeout_s: float = 10.0
    max_bytes: int = 64 * 1024 * 1024


@dataclass(frozen=True)
class MediaCaps:
    """Upper bounds a request's mm_processor_kwargs may lower but never raise (None: checkpoint default)."""

    image_max_pixels: int | None = None
    video_max_pixels: int | None = None
    max_video_frames: int = 768
    max_video_fps: float | None = None  # None: 30, the most vLLM's video loaders sample
    video_defaults: tuple[tuple[str, Any], ...] = ()  # --media-io-kwargs '{"video": {...}}': fps or num_frames
    uuid_cache_bytes: int = 256 * 1024 * 1024  # processed media kept for requests that name it by uuid
    uuid_name_entries: int = 65536  # (client scope, uuid) names remembered for requests that send a uuid alone


@dataclass(frozen=True)
class ServerConfig:
    model_dir: str
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    max_body_bytes: int = 100 * 1024 * 1024
    reasoning_parser: str | None = None
    tool_parser: str | None = None
    tool_strict_level: str = "auto"  # vLLM's --tool-strict-level: auto, function or parameter
    fetch: FetchConfig = field(default_factory=FetchConfig)
    caps: MediaCaps = field(default_factory=MediaCaps)
    templates: TemplateLimits = field(default_factory=TemplateLimits)  # how a request's own chat_template runs
    engine_options: dict[str, Any] = field(default_factory=dict)
    replicas: int | None = None  # None: one engine in this process; N: N Ray actors behind a router
    ray_address: str | None = None  # None: start a local Ray
    engine_core: str = "thread"  # "thread": the engine steps on a thread here; "process": in its own process
    max_sequences_per_request: int = 256  # prompts x n in one request
    max_logprob_entries: int = 1 << 20  # logprobs one answer may carry: n x new tokens x (1 + top k), + the prompt's
    metrics_public: bool = False  # /metrics and /version answer without the API key
    body_timeout_s: float = 30.0  # the whole request body must arrive within this
    header_timeout_s: float = 10.0  # ... and its headers within this of the connection (or of the last response)
    shutdown_timeout_s: float = 30.0  # on SIGTERM, in-flight requests get this long before they end with an error
    allowed_weights_paths: tuple[Path, ...] | None = None  # refits from disk; None: the model folder's parent
    # vLLM drop-in (issue 17): set by the CLI, applied by the request pipeline
    extra_served_names: tuple[str, ...] = ()  # further --served-model-name values (the first is served_model_name)
    chat_template: str | None = None  # --chat-template: the template text (a file's content or the string given)
    generation_config: str = "auto"  # "auto": the checkpoint's generation_config.json defaults; "vllm": none; or DIR
    limit_mm_per_prompt: dict[str, int] | None = None  # {"image": 4, "video": 1}: a 400 naming the modality past it
    # RL protocols (issue 18)
    weight_transfer_backend: str | None = None  # --weight-transfer-config's backend: "gloo" or "nccl"; None: off
    enable_sleep_mode: bool = False  # --enable-sleep-mode: /sleep and /wake_up work (else a 400 says so)

    @property
    def model_name(self) -> str:
        return self.served_model_name or Path(self.model_dir).name
