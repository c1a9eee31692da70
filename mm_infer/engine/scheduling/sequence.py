"""Sequence: one sample's token state, blocks and outputs; SequenceGroup: the n samples of one request."""

from __future__ import annotations

import enum
import hashlib
import itertools
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mm_infer.engine.errors import RequestError
from mm_infer.engine.sampling.params import SamplingParams
from mm_infer.engine.scheduling.routing_rows import RoutingRows
from mm_infer.prompt.placeholders import PlaceholderRange
from mm_infer.structured.reasoning import ReasoningGate, gate_matcher

if TYPE_CHECKING:  # the scheduler side stays torch-free: the request (with its tensors) is only a type here
    from mm_infer.engine.outputs.detokenizer import IncrementalDetokenizer
    from mm_infer.prompt.request import VLMRequest


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class RequestMetrics:
    arrival_time: float
    first_token_time: float | None = None
    finished_time: float | None = None


@dataclass
class SequenceGroup:
    """The samples of one request, and the prepared request they share."""

    request_id: str
    params: SamplingParams
    request: VLMRequest
    seqs: list[Sequence] = field(default_factory=list)
    aborted: bool = False
    error: RequestError | None = None  # why the engine failed this request, if it did
    held: bool = False  # not scheduled (keeps its KV) while its reader is behind: stream backpressure
    metrics: RequestMetrics = field(default_factory=lambda: RequestMetrics(0.0))

    @property
    def placeholders(self) -> list[PlaceholderRange]:
        return self.request.placeholders

    @property
    def item_patches(self) -> list[int]:
        """Vision patches per media item (the encoder budget), prompt order."""
        return self.request.item_patches

    @property
    def finished(self) -> bool:
        return all(s.status is SequenceStatus.FINISHED for s in self.seqs)


_seq_counter = itertools.count()


class Sequence:
    """Tokens (expanded prompt + generated), KV block table, progress and outputs of one sample."""

    def __init__(self, group: SequenceGroup, prompt_token_ids: list[int], index: int = 0) -> None:
        self.seq_id = next(_seq_counter)
        self.group = group
        self.index = index
        self.params = group.params.for_sample(index)
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # prompt tokens served from the prefix cache at admission
        self.block_table: list[int] = []
        self.block_hashes: list[bytes] = []  # chained hashes of the first len() full blocks
        self.num_committed_blocks = 0  # leading blocks already offered to the prefix cache
        self.status = SequenceStatus.WAITING
        self.logprobs: list[float] = []
        self.top_logprobs: list[dict[int, float]] = []
        self.prompt_logprobs: list[float | None] = []  # None for the first token
        self.prompt_top_logprobs: list[dict[int, float] | None] = []
        self.prompt_ranks: list[int | None] = []  # rank of each prompt token (1: the most likely)
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.seed = 0  # the stream of this sample's random draws (set by the engine: the request's seed + index)
        self.num_preemptions = 0
        self.detok: IncrementalDetokenizer | None = None  # set by the engine when text is wanted per step
        self._matcher: Any = None  # xgrammar GrammarMatcher of a structured-output sample (set by the engine)
        self.last_text_chars = 0  # characters the last token committed
        self.final_text: str | None = None  # the whole text, assembled once when the sample ends
        self.emitted_tokens = 0  # output tokens already sent in delta outputs
        self.emitted_chars = 0  # characters already sent in delta outputs
        self.cumulative_logprob = 0.0
        self.routing: RoutingRows | None = None  # its MoE routing, when the engine returns it (R3)
        self.state_slot: int | None = None  # hybrid models: its live recurrent-state slot while it holds blocks
        self.restore_slot: int | None = None  # a prefix hit's snapshot its first computed chunk continues from
        self.pending_snapshots: list[tuple[int, int]] = []  # (position, slot) its running chunk keeps the state at
        self._boundaries: tuple[int, ...] | None = None

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def matcher(self) -> Any:
        """The sample's grammar matcher (the engine sets it, feeds it each token and asks whether it terminated); when
        the spec names reasoning end ids and the prompt leaves the reasoning open, a ReasoningGate around it."""
        return self._matcher

    @matcher.setter
    def matcher(self, matcher: Any) -> None:
        self._matcher = gate_matcher(matcher, self.params.structured_outputs, self.token_ids)

    @property
    def grammar_matcher(self) -> Any:
        """The matcher that masks the next token: None without a grammar, or while the sample still reasons."""
        m = self._matcher
        return m.masking if isinstance(m, ReasoningGate) else m

    def state_boundaries(self, block_size: int) -> tuple[int, ...]:
        """Hybrid models: where the prompt's recurrent state is kept for prefix hits, and where every run (cold or
        hit) restarts its scan: the last full block before each media item ends, and before the prompt's last
        token, sorted."""
        if self._boundaries is None:
            last = (self.num_prompt_tokens - 1) // block_size * block_size
            ends: dict[int, int] = {}
            for r in self.group.placeholders:
                ends[r.item_index] = max(ends.get(r.item_index, 0), r.end)
            cuts = {end // block_size * block_size for end in ends.values()} | {last}
            self._boundaries = tuple(sorted(b for b in cuts if 0 < b <= last))
        return self._boundaries

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def stop_terminated(self) -> bool:
        """Ended by a token (EOS, a stop token id, a grammar's stop token), not by a stop string (vLLM's rule)."""
        return self.finish_reason == "stop" and not isinstance(self.stop_reason, str)

    @property
    def num_pending_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def in_prompt(self) -> bool:
        return self.num_computed_tokens < self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def add_prompt_logprobs(self, first: int, logprobs: list[float], tops: list[dict[int, float]] | None,
                            ranks: list[int] | None = None) -> None:
        """Scores of prompt tokens first, first+1, ... (chunks arrive in order; the first token has none)."""
        if not self.prompt_logprobs:
            self.prompt_logprobs.append(None)
            self.prompt_top_logprobs.append(None)
            self.prompt_ranks.append(None)
        assert first == len(self.prompt_logprobs), "prompt logprobs out of order"
        self.prompt_logprobs.extend(logprobs)
        self.prompt_top_logprobs.extend(tops or [None] * len(logprobs))
        self.prompt_ranks.extend(ranks or [None] * len(logprobs))

    def items_in(self, start: int, end: int) -> list[PlaceholderRange]:
        """Placeholder ranges that intersect token positions [start, end)."""
        ranges = self.group.placeholders
        if not ranges or start >= self.num_prompt_tokens:
            return []
        hi = bisect_right([r.offset for r in ranges], end - 1)
        return [r for r in ranges[:hi] if r.end > start]

    def _root_hash(self) -> bytes:
        """Seed of the hash chain: a request's cache_salt (vLLM's) keeps its blocks apart from unsalted ones."""
        salt = getattr(self.group.request, "cache_salt", None)
        return b"root" if salt is None else b"salt:" + salt.encode("utf-8", "surrogatepass")

    def block_hash(self, block_idx: int, block_size: int) -> bytes:
        """Chained hash of full block block_idx: parent hash, token ids, and media in the block."""
        while len(self.block_hashes) <= block_idx:
            i = len(self.block_hashes)
            start, end = i * block_size, (i + 1) * block_size
            h = hashlib.blake2b(self.block_hashes[-1] if i else self._root_hash(), digest_size=16)
            h.update(repr(self.token_ids[start:end]).encode())
            for r in self.items_in(start, end):  # same text + different media never collide
                h.update(f"|{r.modality}:{r.content_hash}:{max(start - r.offset, 0)}".encode())
            self.block_hashes.append(h.digest())
        return self.block_hashes[block_idx]
