"""Frozen engine configuration, one dataclass per concern, plus the runtime values known after start-up."""

from __future__ import annotations

from dataclasses import dataclass, field

from mm_infer.sizes import parse_size

CPU_KV_CACHE_BYTES = 256 << 20  # the CPU pool when no size is given


@dataclass(frozen=True)
class CacheConfig:
    """Paged KV cache and encoder cache sizing.

    The KV pool is, in order of precedence: num_kv_blocks; kv_cache_memory_bytes (int or "4GiB"); on CUDA, what
    gpu_memory_utilization of the device leaves after the weights, a profiled peak step and the encoder cache
    (vLLM's meaning); on CPU, CPU_KV_CACHE_BYTES.
    """

    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_memory_bytes: int | str | None = None
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = True
    encoder_cache_items: int = 256  # vision embeddings kept (LRU), bounded by count and by bytes
    encoder_cache_bytes: int | str = 512 << 20
    state_snapshots: int | None = None  # hybrid models: recurrent-state snapshots for prefix hits (None: max_num_seqs)

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.state_snapshots is not None and self.state_snapshots < 0:
            raise ValueError(f"state_snapshots must be >= 0, got {self.state_snapshots}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be >= 1, got {self.num_kv_blocks}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.kv_cache_memory_bytes is not None:
            object.__setattr__(self, "kv_cache_memory_bytes", parse_size(self.kv_cache_memory_bytes))
        object.__setattr__(self, "encoder_cache_bytes", parse_size(self.encoder_cache_bytes))


@dataclass(frozen=True)
class SchedulerConfig:
    """Continuous batching limits for one engine step."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192  # chunked-prefill token budget per step
    max_encoder_tokens_per_step: int = 16384  # vision patches encoded per step
    max_model_len: int | None = None  # None: the checkpoint's max_position_embeddings
    # vLLM's name: the most prompt tokens one request prefills in a step (0: up to the step's budget), so one long
    # prompt cannot make every other request's next token wait for a whole max_num_batched_tokens chunk
    long_prefill_token_threshold: int = 0

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1 or self.max_encoder_tokens_per_step < 1:
            raise ValueError("scheduler limits must be >= 1")
        if self.long_prefill_token_threshold < 0:
            raise ValueError("long_prefill_token_threshold must be >= 0 (0: off)")


@dataclass(frozen=True)
class MediaConfig:
    """Media preparation defaults; None fields come from the checkpoint's preprocessor configs."""

    image_min_pixels: int | None = None
    image_max_pixels: int | None = None
    video_min_pixels: int | None = None
    video_max_pixels: int | None = None
    video_fps: float = 2.0  # used when video_preprocessor_config.json sets no fps
    video_sampler: str | None = None  # frame_sampling.SAMPLERS; None: the checkpoint's HF video processor's rule
    mrope_after_video: str = "hf"  # where text resumes after a video: "hf" (transformers 5) or "vllm" (mrope.py)


@dataclass(frozen=True)
class StructuredConfig:
    """Grammar compilation for structured outputs: off the step loop on `grammar_threads` threads, a spec over
    `max_grammar_bytes` refused (400), a compile past `grammar_timeout_s` failing its request (400), compiled
    grammars kept up to `grammar_cache_bytes` (LRU)."""

    grammar_threads: int = 2
    grammar_timeout_s: float = 30.0
    max_grammar_bytes: int | str = 256 << 10  # the spec's canonical text (a JSON schema, regex, EBNF, ...)
    grammar_cache_bytes: int | str = 256 << 20

    def __post_init__(self) -> None:
        object.__setattr__(self, "max_grammar_bytes", parse_size(self.max_grammar_bytes))
        object.__setattr__(self, "grammar_cache_bytes", parse_size(self.grammar_cache_bytes))
        if self.grammar_threads < 1 or self.grammar_timeout_s <= 0 or self.max_grammar_bytes < 1:
            raise ValueError("grammar_threads, grammar_timeout_s and max_grammar_bytes must be positive")


@dataclass(frozen=True)
class EngineConfig:
    """Everything needed to start an engine on one device."""

    model_dir: str
    dtype: str = "auto"  # auto: float32 on CPU, bfloat16 on CUDA
    device: str = "auto"
    seed: int = 0
    weight_version: int = 0
    cpu_threads: int | None = None  # torch intra-op threads (process-wide); None leaves torch's setting
    cpu_threads_heavy: int | None = None  # threads for heavy steps (step_threads.py); None: cpu_threads throughout
    # a request's tokens and logprobs identical alone or in any batch (CPU: pads GEMMs to 16 rows); costs speed
    batch_invariant: bool = False
    enforce_eager: bool = False  # CUDA: no decode CUDA graphs (the static decode path still runs, eagerly)
    # R3: every finished sample carries its tokens' MoE routing (vLLM's --enable-return-routed-experts); MoE only
    enable_return_routed_experts: bool = False
    tensor_parallel_size: int = 1  # ranks (processes) one model is split over (mm_infer/parallel)
    # tensor parallelism: all-reduces add the ranks' partial sums in rank order (batch- and algorithm-independent)
    tp_deterministic: bool = False
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    media: MediaConfig = field(default_factory=MediaConfig)
    structured: StructuredConfig = field(default_factory=StructuredConfig)

    @staticmethod
    def from_options(model_dir: str, **options: object) -> EngineConfig:
        """Build from flat keyword options (vLLM-style names), routing each to its concern."""
        groups: dict[type, dict[str, object]] = {CacheConfig: {}, SchedulerConfig: {}, MediaConfig: {},
                                                 StructuredConfig: {}}
        top: dict[str, object] = {}
        top_names = {"dtype", "device", "seed", "weight_version", "cpu_threads", "cpu_threads_heavy", "batch_invariant",
                     "enforce_eager", "enable_return_routed_experts", "tensor_parallel_size", "tp_deterministic"}
        for key, value in options.items():
            owner = next((cls for cls in groups if key in cls.__dataclass_fields__), None)
            if owner is not None:
                groups[owner][key] = value
            elif key in top_names:
                top[key] = value
            else:
                raise TypeError(f"unknown engine option {key!r}")
        return EngineConfig(model_dir=model_dir, cache=CacheConfig(**groups[CacheConfig]),
                            scheduler=SchedulerConfig(**groups[SchedulerConfig]),
                            media=MediaConfig(**groups[MediaConfig]),
                            structured=StructuredConfig(**groups[StructuredConfig]), **top)  # type: ignore[arg-type]


@dataclass(frozen=True)
class SpecialTokens:
    """Token ids the engine treats specially."""

    image_pad_id: int
    video_pad_id: int
    vision_start_id: int
    vision_end_id: int
    eos_ids: tuple[int, ...] = ()

    @property
    def pad_ids(self) -> tuple[int, int]:
        return (self.image_pad_id, self.video_pad_id)


@dataclass(frozen=True)
class EngineRuntime:
    """Values known only after the model is loaded and the cache is sized."""

    num_kv_blocks: int
    block_size: int
    max_model_len: int
    vocab_size: int
    merge_size: int
    special: SpecialTokens
