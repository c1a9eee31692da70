"""SamplingParams: how one request is decoded (vLLM field names and defaults)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace

from mm_infer.structured.params import StructuredOutputsParams

_GREEDY_EPS = 1e-5
LOGPROBS_MODES = ("raw_logprobs", "processed_logprobs")


class RequestOutputKind(enum.Enum):
    """What each output of a request carries (vLLM's names)."""

    CUMULATIVE = 0  # everything so far, at every step
    DELTA = 1  # only what is new since the previous output
    FINAL_ONLY = 2  # one output, when the request ends


@dataclass
class SamplingParams:
    """Decoding options for one prompt; `n` samples share the prompt's KV and vision embeddings."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16  # None: up to the context length
    min_tokens: int = 0
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    logprobs: int | None = None  # top-k alternatives per step; the sampled logprob is always kept
    prompt_logprobs: int | None = None
    logprobs_mode: str = "raw_logprobs"
    skip_special_tokens: bool = True
    detokenize: bool = True
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    structured_outputs: StructuredOutputsParams | None = None  # the grammar the output follows (a dict is converted)
    routed_experts_prompt_start: int = 0  # R3 (vLLM's): the routing returned skips this many prompt tokens
    stop_list: list[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.stop_list = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        self.logit_bias = {int(k): float(v) for k, v in (self.logit_bias or {}).items()}
        if self.top_k == -1:
            self.top_k = 0
        if isinstance(self.structured_outputs, dict):
            self.structured_outputs = StructuredOutputsParams(**self.structured_outputs)
        self._validate()

    def _validate(self) -> None:
        checks = [
            (self.n >= 1, f"n must be >= 1, got {self.n}"),
            (self.temperature >= 0.0, f"temperature must be >= 0, got {self.temperature}"),
            (0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}"),
            (self.top_k >= 0, f"top_k must be -1, 0 or positive, got {self.top_k}"),
            (0.0 <= self.min_p <= 1.0, f"min_p must be in [0, 1], got {self.min_p}"),
            (self.max_tokens is None or self.max_tokens >= 1, f"max_tokens must be >= 1, got {self.max_tokens}"),
            (self.min_tokens >= 0, f"min_tokens must be >= 0, got {self.min_tokens}"),
            (self.max_tokens is None or self.min_tokens <= self.max_tokens,
             f"min_tokens ({self.min_tokens}) must be <= max_tokens ({self.max_tokens})"),
            (-2.0 <= self.presence_penalty <= 2.0, f"presence_penalty must be in [-2, 2], got {self.presence_penalty}"),
            (-2.0 <= self.frequency_penalty <= 2.0,
             f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}"),
            (self.repetition_penalty > 0.0, f"repetition_penalty must be > 0, got {self.repetition_penalty}"),
            (self.logprobs is None or self.logprobs >= 0, f"logprobs must be >= 0, got {self.logprobs}"),
            (self.prompt_logprobs is None or self.prompt_logprobs >= 0,
             f"prompt_logprobs must be >= 0, got {self.prompt_logprobs}"),
            (self.logprobs_mode in LOGPROBS_MODES, f"logprobs_mode must be one of {LOGPROBS_MODES}"),
            (all(s for s in self.stop_list), "stop strings must be non-empty"),
            (self.routed_experts_prompt_start >= 0,
             f"routed_experts_prompt_start must be >= 0, got {self.routed_experts_prompt_start}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    @property
    def greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS

    @property
    def has_penalties(self) -> bool:
        return (self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
                or self.repetition_penalty != 1.0)

    def final_only(self) -> SamplingParams:
        """These params with one output per request, when it ends (batch callers: LLM.generate, rollouts)."""
        if self.output_kind is RequestOutputKind.FINAL_ONLY:
            return self
        return replace(self, output_kind=RequestOutputKind.FINAL_ONLY)

    def for_sample(self, index: int) -> SamplingParams:
        """Params of the index-th of n samples: n=1 and, when seeded, seed + index (as vLLM)."""
        seed = None if self.seed is None else self.seed + index
        return replace(self, n=1, seed=seed)
