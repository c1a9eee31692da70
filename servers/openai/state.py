"""ServerState: the backend and the per-server helpers every endpoint shares, built once at start-up."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from mm_infer.engine.open_engine import open_engine
from mm_infer.media import MediaLimits, MediaProcessor
from mm_infer.prompt.preparer import PromptPreparer
from mm_infer.prompt.template_workers import TemplateWorkers
from mm_infer.serving import EngineBackend, LocalBackend
from servers.openai.answers.parsers import OutputParser, build_output_parser
from servers.openai.bodies.generation_defaults import load_generation_defaults, log_generation_defaults
from servers.openai.config import ServerConfig
from servers.openai.control.pause import PauseGate
from servers.openai.media.features import FeatureStore
from servers.openai.media.request_media import MediaFetcher, MediaResolver
from servers.openai.web.metrics import Metrics, Reading


@dataclass
class ServerState:
    config: ServerConfig
    backend: EngineBackend  # one engine here, or a pool of replicas
    preparer: PromptPreparer  # the backend's: tokenizer, chat renderer, placeholder ids, media defaults
    media: MediaResolver
    parser: OutputParser
    gate: PauseGate
    sampling_defaults: dict[str, Any] = field(default_factory=dict)  # generation_config defaults (vLLM's rule)
    features: FeatureStore = field(default_factory=lambda: FeatureStore(256 << 20))  # render's items, by hash
    metrics: Metrics = field(default_factory=Metrics)
    templates: TemplateWorkers = field(default_factory=TemplateWorkers)  # a request's own chat_template renders here
    created: int = field(default_factory=lambda: int(time.time()))

    def gauges(self) -> Reading:
        """What /metrics reads now: the backend's gauges and counters, the media caches', the pause gate's."""
        media_cache = self.media.processor.cache
        return Reading({**self.backend.engine_gauges(),
                        "media_cache_hits": media_cache.hits, "media_cache_misses": media_cache.misses,
                        "media_uuid_cache_hits": self.media.uuid_hits,
                        "weight_version": self.backend.weight_version, "paused": int(self.gate.paused)},
                       self.config.model_name)

    async def aclose(self) -> None:
        self.backend.shutdown()
        self.templates.close()
        self.media.processor.close()
        await self.media.fetcher.aclose()


def build_backend(config: ServerConfig) -> EngineBackend:
    """One engine (stepped on a thread here, or in its own process), or `config.replicas` Ray actors behind a
    router."""
    options = dict(config.engine_options)
    if config.replicas is None and config.engine_core == "process":
        from mm_infer.engine_core import CoreProcessBackend

        return CoreProcessBackend(config.model_dir, options)
    if config.replicas is None:
        return LocalBackend(open_engine(config.model_dir, **options))
    from mm_infer.distributed import PoolConfig, ReplicaPool  # Ray is imported only when asked for

    return ReplicaPool(PoolConfig(config.model_dir, config.replicas, options, ray_address=config.ray_address))


def build_state(config: ServerConfig, backend: EngineBackend | None = None) -> ServerState:
    """Load the backend (unless given) and wire the media pipeline, parsers and pause gate to it."""
    defaults = load_generation_defaults(config.generation_config, config.model_dir)  # a bad one fails first
    log_generation_defaults(config.generation_config, defaults)
    backend = backend or build_backend(config)
    limits = MediaLimits(max_bytes=config.fetch.max_bytes, max_sampled_frames=config.caps.max_video_frames)
    image_options, video_options = backend.preparer.media_defaults.processor_options()  # the checkpoint's patch spec
    media = MediaResolver(MediaFetcher(config.fetch), MediaProcessor(limits=limits, image_options=image_options,
                                                                     video_options=video_options),
                          backend.preparer.media_defaults, config.caps)
    return ServerState(config, backend, backend.preparer, media,
                       build_output_parser(config.reasoning_parser, config.tool_parser), PauseGate(backend),
                       defaults, features=FeatureStore(config.caps.uuid_cache_bytes),
                       templates=TemplateWorkers(config.templates))
