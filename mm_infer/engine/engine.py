"""LLMEngine: add_request / step / abort / has_unfinished over scheduler, model runner and sampler."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from mm_infer.config import EngineConfig, EngineRuntime, SpecialTokens
from mm_infer.engine.block_manager import BlockManager
from mm_infer.engine.encoder_cache import EncoderCache
from mm_infer.engine.frontend import PromptFrontend
from mm_infer.engine.model_runner import ModelRunner
from mm_infer.engine.outputs import RequestMetrics, RequestOutput, check_stop, make_output
from mm_infer.engine.request import VLMRequest
from mm_infer.engine.sampler import Sampler
from mm_infer.engine.sampling import SamplingParams
from mm_infer.engine.scheduler import Scheduler
from mm_infer.engine.sequence import Sequence, SequenceGroup
from mm_infer.models import load_model
from mm_infer.prompt.placeholders import PromptError


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]


def _max_positions(model_dir: Path) -> int:
    raw = json.loads((model_dir / "config.json").read_text())
    return int((raw.get("text_config") or {}).get("max_position_embeddings") or raw.get("max_position_embeddings")
               or 32768)


def _eos_ids(model_dir: Path, config_eos: int | tuple[int, ...] | None) -> tuple[int, ...]:
    ids = list(config_eos if isinstance(config_eos, tuple) else [] if config_eos is None else [config_eos])
    gen = model_dir / "generation_config.json"
    if gen.exists():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        ids += eos if isinstance(eos, list) else [] if eos is None else [eos]
    return tuple(dict.fromkeys(int(i) for i in ids))


class LLMEngine:
    """One model on one device; call step() until has_unfinished() is False."""

    def __init__(self, config: EngineConfig, tokenizer: Any = None) -> None:
        self.config = config
        if config.cpu_threads:
            torch.set_num_threads(config.cpu_threads)
        device = torch.device(config.device if config.device != "auto" else
                              ("cuda" if torch.cuda.is_available() else "cpu"))
        model_dir = Path(config.model_dir)
        self.model, mcfg = load_model(model_dir, resolve_dtype(config.dtype, device), device)
        self.frontend = PromptFrontend(model_dir, config.media, tokenizer, mcfg)
        self.tokenizer = self.frontend.tokenizer
        self.placeholder_ids = self.frontend.placeholder_ids
        special = SpecialTokens(*(getattr(self.placeholder_ids, f) for f in
                                  ("image_pad_id", "video_pad_id", "vision_start_id", "vision_end_id")),
                                eos_ids=_eos_ids(model_dir, mcfg.eos_token_id))
        cache = config.cache
        per_block = ModelRunner.kv_bytes_per_block(self.model, cache.block_size)
        num_blocks = cache.num_kv_blocks or max(cache.kv_cache_memory_bytes // per_block, 1)
        # one sequence must always fit the pool, or preemption could never make room for it
        max_len = min(config.scheduler.max_model_len or _max_positions(model_dir), num_blocks * cache.block_size)
        self.runtime = EngineRuntime(num_blocks, cache.block_size, max_len, mcfg.text.vocab_size,
                                     mcfg.vision.spatial_merge_size, special)
        self.media_defaults = self.frontend.media_defaults
        self.encoder_cache = EncoderCache(cache.encoder_cache_items, config.weight_version)
        self.block_manager = BlockManager(num_blocks, cache.block_size, cache.enable_prefix_caching)
        self.scheduler = Scheduler(config.scheduler, self.block_manager, self.encoder_cache.__contains__)
        self.runner = ModelRunner(self.model, num_blocks, cache.block_size, self.encoder_cache)
        self.sampler = Sampler(special.pad_ids, special.eos_ids)
        self.eos_ids = frozenset(special.eos_ids)
        self.groups: dict[str, SequenceGroup] = {}
        self.metrics: dict[str, RequestMetrics] = {}
        self._pending: list[RequestOutput] = []  # aborted requests, reported by the next step()
        self._rng = random.Random(config.seed)

    @staticmethod
    def from_options(model_dir: str, tokenizer: Any = None, **options: Any) -> LLMEngine:
        return LLMEngine(EngineConfig.from_options(model_dir, **options), tokenizer)

    def _decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def prepare(self, prompt: str | Mapping[str, Any]) -> VLMRequest:
        return self.frontend.prepare(prompt)

    def add_request(self, request_id: str, prompt: str | Mapping[str, Any] | VLMRequest,
                    params: SamplingParams | None = None) -> None:
        """Prepare the prompt (PromptError / MediaError on bad input) and queue its n samples."""
        if request_id in self.groups:
            raise ValueError(f"request id {request_id!r} is already in use")
        params = params or SamplingParams()
        req = prompt if isinstance(prompt, VLMRequest) else self.prepare(prompt)
        room = self.runtime.max_model_len - len(req.prompt_token_ids)
        if room < 1:
            raise PromptError(f"prompt has {len(req.prompt_token_ids)} tokens; the context length is "
                              f"{self.runtime.max_model_len} (model limit, max_model_len and KV cache size)")
        group = SequenceGroup(request_id, params, req.placeholders, req.item_patches, payload=req)
        for i in range(params.n):
            seq = Sequence(group, req.prompt_token_ids, i)
            seed = seq.params.seed if seq.params.seed is not None else self._rng.getrandbits(63)
            seq.generator = torch.Generator(device="cpu").manual_seed(seed)
            group.seqs.append(seq)
            self.scheduler.add(seq)
        self.groups[request_id] = group
        self.metrics[request_id] = RequestMetrics(time.perf_counter())

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self._pending)

    def _output(self, group: SequenceGroup) -> RequestOutput:
        req: VLMRequest = group.payload
        return make_output(group, req.prompt_token_ids, req.prompt_text, self._decode,
                           self.metrics.get(group.request_id))

    def _max_new(self, seq: Sequence) -> int:
        cap = self.runtime.max_model_len - seq.num_prompt_tokens
        return min(seq.params.max_tokens or cap, cap)

    def step(self, stream: bool = True) -> list[RequestOutput]:
        """Run one scheduled batch; return snapshots of requests that advanced (all, with stream; else only
        finished ones) and of requests aborted since the last step."""
        outputs, self._pending = self._pending, []
        sched = self.scheduler.schedule()
        if not sched.chunks:
            return outputs
        result = self.runner.run(sched.chunks)
        self.scheduler.update(sched)
        for seq_id, (first, lps, tops) in result.prompt_logprobs.items():
            seq = next(c.seq for c in sched.chunks if c.seq.seq_id == seq_id)
            if not seq.prompt_logprobs:
                seq.prompt_logprobs.append(None)
                seq.prompt_top_logprobs.append(None)
            assert first == len(seq.prompt_logprobs), "prompt logprobs out of order"
            seq.prompt_logprobs.extend(lps)
            seq.prompt_top_logprobs.extend(tops or [None] * len(lps))
        seqs = [c.seq for c in result.sample_chunks]
        touched: dict[str, SequenceGroup] = {}
        if seqs:
            sampled = self.sampler(result.sample_logits, seqs)
            now = time.perf_counter()
            for i, seq in enumerate(seqs):
                token = sampled.token_ids[i]
                seq.token_ids.append(token)
                seq.logprobs.append(sampled.logprobs[i])
                if sampled.top_logprobs[i] is not None:
                    seq.top_logprobs.append(sampled.top_logprobs[i])
                metrics = self.metrics[seq.group.request_id]
                metrics.first_token_time = metrics.first_token_time or now
                stop = check_stop(seq, token, self.eos_ids, self._max_new(seq), self._decode)
                if stop is not None:
                    seq.stop_reason = stop[1]
                    self.scheduler.finish(seq, stop[0])
                touched[seq.group.request_id] = seq.group
        for group in touched.values():
            if stream or group.finished:
                outputs.append(self._output(group))
            if group.finished:
                self._release(group)
        return outputs

    def _release(self, group: SequenceGroup) -> None:
        self.groups.pop(group.request_id, None)
        metrics = self.metrics.pop(group.request_id, None)
        if metrics is not None:
            metrics.finished_time = time.perf_counter()

    def abort(self, request_id: str) -> RequestOutput | None:
        """Stop a request now; its partial tokens/logprobs are reported with finish_reason "abort"."""
        group = self.groups.get(request_id)
        if group is None:
            return None
        group.aborted = True
        for seq in group.seqs:
            self.scheduler.finish(seq, "abort")
        out = self._output(group)
        self._release(group)
        self._pending.append(out)
        return out

    def abort_many(self, request_ids: Iterable[str]) -> None:
        for rid in request_ids:
            self.abort(rid)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Load new weights in place; every weight-derived cache (encoder outputs, prefix KV) is dropped."""
        from mm_infer.models import load_state_dict_into

        load_state_dict_into(self.model, named_tensors)
        self.encoder_cache.set_weight_version(version)
        self.block_manager.reset_prefix_cache()

    @property
    def weight_version(self) -> int:
        """The version of the weights now loaded (the encoder cache keys on it)."""
        return self.encoder_cache.weight_version

    def reset_caches(self) -> None:
        """Forget cached vision embeddings and prefix KV (running requests keep their own blocks)."""
        self.encoder_cache.clear()
        self.block_manager.reset_prefix_cache()

    def stats(self) -> dict[str, int]:
        bm = self.block_manager
        return {"encoder_calls": self.runner.encoder_calls, "encoder_cache_hits": self.encoder_cache.stats.hits,
                "prefix_query_tokens": bm.stats.queries, "prefix_hit_tokens": bm.stats.hits,
                "preemptions": self.scheduler.num_preemptions, "free_blocks": bm.num_free_blocks,
                "num_blocks": bm.num_blocks}
