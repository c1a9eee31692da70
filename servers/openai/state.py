"""ServerState: the engine and the per-server helpers every endpoint shares, built once at start-up."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from mm_infer.engine.engine import LLMEngine
from mm_infer.media import MediaLimits, MediaProcessor
from mm_infer.prompt.templating import ChatRenderer
from servers.openai.backend import EngineBackend, LocalBackend
from servers.openai.config import ServerConfig
from servers.openai.fetch import MediaFetcher
from servers.openai.media_inputs import MediaResolver
from servers.openai.metrics import Metrics
from servers.openai.parsers import OutputParser, build_output_parser
from servers.openai.pause import PauseGate
from servers.openai.refit import Refitter


@dataclass
class ServerState:
    config: ServerConfig
    engine: EngineBackend
    renderer: ChatRenderer
    resolver: MediaResolver
    parser: OutputParser
    gate: PauseGate
    refitter: Refitter
    metrics: Metrics = field(default_factory=Metrics)
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    @property
    def weight_version(self) -> int:
        return self.engine.weight_version

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def vocab_size(self) -> int:
        return self.engine.vocab_size

    @property
    def engine_alive(self) -> bool:
        return self.engine.is_alive

    def token_str(self, token_id: int, as_id: bool) -> str:
        return f"token_id:{token_id}" if as_id else self.tokenizer.decode([token_id], skip_special_tokens=False)

    def gauges(self) -> dict[str, float]:
        media_cache = self.resolver.processor.cache
        return {**self.engine.engine_gauges(),
                "media_cache_hits": media_cache.hits, "media_cache_misses": media_cache.misses,
                "media_uuid_cache_hits": self.resolver.uuid_hits,
                "weight_version": self.weight_version, "paused": int(self.gate.paused)}

    async def aclose(self) -> None:
        self.engine.shutdown()
        self.resolver.processor.close()
        await self.resolver.fetcher.aclose()


def build_backend(config: ServerConfig) -> EngineBackend:
    """One engine in this process, or `config.replicas` Ray actors behind a router."""
    options = dict(config.engine_options)
    if config.replicas is None:
        return LocalBackend(LLMEngine.from_options(config.model_dir, **options))
    from mm_infer.distributed import PoolConfig, ReplicaPool  # Ray is imported only when asked for

    return ReplicaPool(PoolConfig(config.model_dir, config.replicas, options, ray_address=config.ray_address))


def build_state(config: ServerConfig, engine: EngineBackend | None = None) -> ServerState:
    """Load the engine (unless given) and wire the tokenizer, media pipeline and parsers to it."""
    engine = engine or build_backend(config)
    ids = engine.placeholder_ids
    decode = engine.tokenizer.decode
    media_tokens = {kind: decode([ids.vision_start_id, pad, ids.vision_end_id], skip_special_tokens=False)
                    for kind, pad in (("image", ids.image_pad_id), ("video", ids.video_pad_id))}
    limits = MediaLimits(max_bytes=config.fetch.max_bytes, max_sampled_frames=config.caps.max_video_frames)
    processor = MediaProcessor(limits=limits)
    resolver = MediaResolver(MediaFetcher(config.fetch), processor, engine.media_defaults, config.caps)
    gate = PauseGate(engine)
    return ServerState(config, engine, ChatRenderer(engine.tokenizer, media_tokens), resolver,
                       build_output_parser(config.reasoning_parser, config.tool_parser), gate,
                       Refitter(engine, gate))
