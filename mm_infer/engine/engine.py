"""LLMEngine: add_request / step / abort / has_unfinished over scheduler, model runner and sampler."""

from __future__ import annotations

import random
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from mm_infer.config import EngineConfig
from mm_infer.engine.control.sleep import sleep, wake_up
from mm_infer.engine.control.sleep_state import EngineAsleepError, SleepState
from mm_infer.engine.errors import NONFINITE_MODEL, NONFINITE_PARAMS, RequestError, step_failure
from mm_infer.engine.outputs.detokenizer import IncrementalDetokenizer
from mm_infer.engine.outputs.request_output import RequestOutput, make_output
from mm_infer.engine.outputs.request_stats import RequestStats
from mm_infer.engine.outputs.stopping import apply_stop_rules
from mm_infer.engine.runner.memory_profile import cuda_kv_budget
from mm_infer.engine.runner.model_runner import MIN_ROWS, ModelRunner, StepLimits, StepOutput
from mm_infer.engine.runner.step_threads import StepThreads, checked_heavy_threads
from mm_infer.engine.runtime import build_runtime, kv_pool_blocks, pick_device, resolve_dtype
from mm_infer.engine.sampling.params import RequestOutputKind, SamplingParams
from mm_infer.engine.sampling.sampler import RAW_NONFINITE, Sampler, SampleResult
from mm_infer.engine.scheduling.block_manager import BlockManager
from mm_infer.engine.scheduling.encoder_cache import EncoderCache
from mm_infer.engine.scheduling.fault_isolation import culprits
from mm_infer.engine.scheduling.routing_rows import RoutingRows
from mm_infer.engine.scheduling.scheduler import Scheduler, SchedulerOutput
from mm_infer.engine.scheduling.sequence import RequestMetrics, Sequence, SequenceGroup
from mm_infer.engine.scheduling.state_slots import state_slots
from mm_infer.models import load_model
from mm_infer.parallel.group import RankGroup, RankLostError, rank_device
from mm_infer.prompt.placeholders import PromptError
from mm_infer.prompt.preparer import Prompt, PromptPreparer
from mm_infer.prompt.request import VLMRequest
from mm_infer.structured.grammars import Grammars

__all__ = ["COMPILE", "LLMEngine", "resolve_dtype"]

COMPILE: Any = object()  # add_request's default: compile the request's grammar there


class LLMEngine:
    """One model on one device; call step() until has_unfinished() is False."""

    def __init__(self, config: EngineConfig, tokenizer: Any = None, group: RankGroup | None = None) -> None:
        """`group`: this engine is one tensor-parallel rank (parallel/leader.py and follower.py make them)."""
        if config.tensor_parallel_size != (1 if group is None else group.size):
            raise ValueError(f"tensor_parallel_size={config.tensor_parallel_size}: open the engine with "
                             "mm_infer.engine.open_engine.open_engine (LLM and the servers do), which starts its ranks")
        self.config = config
        if config.cpu_threads:
            torch.set_num_threads(config.cpu_threads)
        device = rank_device(pick_device(config.device), group)
        model_dir = Path(config.model_dir)
        self.model, mcfg = load_model(model_dir, resolve_dtype(config.dtype, device), device, group)
        self.preparer = PromptPreparer(model_dir, config.media, tokenizer, mcfg)
        self.tokenizer = self.preparer.tokenizer
        cache = config.cache
        per_block = ModelRunner.kv_bytes_per_block(self.model, cache.block_size)
        states = state_slots(self.model, config)
        state_bytes = states.total * self.model.state_bytes_per_slot() if states else 0
        num_blocks = kv_pool_blocks(config, device, per_block, lambda: cuda_kv_budget(self.model, config, per_block),
                                    state_bytes)
        if group is not None:  # every rank schedules the same blocks: the smallest pool any rank holds
            num_blocks = group.min_int(num_blocks)
        self.runtime = build_runtime(config, mcfg, self.preparer.placeholder_ids, num_blocks, per_block)
        self.encoder_cache = EncoderCache(cache.encoder_cache_items, config.weight_version, cache.encoder_cache_bytes)
        self.block_manager = BlockManager(self.runtime.num_kv_blocks, cache.block_size, cache.enable_prefix_caching,
                                          states)
        self.scheduler = Scheduler(config.scheduler, self.block_manager, self.encoder_cache.__contains__)
        if states is not None and config.batch_invariant:  # the scan's chunks fixed by the sequence's own positions
            self.scheduler.scan_chunk = self.model.scan_chunk
        self.runner = ModelRunner(self.model, self.runtime.num_kv_blocks, cache.block_size, self.encoder_cache,
                                  self._step_limits(config, device), config.batch_invariant)
        if config.enable_return_routed_experts and self.runner.routing is None:
            why = ("routing replay is not built for hybrid (NemotronH) models yet" if states else
                   f"{model_dir.name} has no MoE layer")
            raise ValueError(f"--enable-return-routed-experts needs a Qwen3-VL MoE model; {why}")
        special = self.runtime.special
        self.sampler = Sampler(special.pad_ids, special.eos_ids)
        self.eos_ids = special.eos_ids  # ordered: the first is the main EOS (stop_reason null), the rest stop ids
        self.grammars = Grammars(lambda: self.tokenizer, config.model_dir, self.runtime.vocab_size, special.eos_ids,
                                 config.structured)
        self.groups: dict[str, SequenceGroup] = {}
        self.request_stats = RequestStats(self.runtime.max_model_len)  # vLLM's request / step series
        self._aborted: list[RequestOutput] = []  # outputs of aborted requests, reported by the next step()
        self._rng = random.Random(config.seed)
        self.sleep_state = SleepState()  # engine/control/sleep_state.py: what a sleep released
        self.sleep_kv_shape: Any = None

    def _step_limits(self, config: EngineConfig, device: torch.device) -> StepLimits:
        """Static decode everywhere but under CPU batch invariance (whose length buckets keep rows independent)."""
        cpu = device.type == "cpu"
        heavy = config.cpu_threads_heavy if cpu and not config.batch_invariant else None  # invariance: one setting
        heavy = checked_heavy_threads(torch.get_num_threads(), heavy)
        sched = config.scheduler
        routing_rows = max(sched.max_num_batched_tokens, sched.max_num_seqs, MIN_ROWS)  # padded batches included
        hybrid = self.block_manager.states is not None  # the static decode buffers hold no recurrent state
        return StepLimits(self.runtime.max_model_len, sched.max_num_seqs,
                          static_decode=not (config.batch_invariant and device.type != "cuda") and not hybrid,
                          capture=device.type == "cuda" and not config.enforce_eager, threads=StepThreads(heavy),
                          routing_rows=routing_rows if config.enable_return_routed_experts else 0,
                          state_slots=self.block_manager.states.total if hybrid else 0)

    @staticmethod
    def from_options(model_dir: str, tokenizer: Any = None, **options: Any) -> LLMEngine:
        """One process's engine; a tensor-parallel one comes from engine/open_engine.py (LLM and the servers
        use it)."""
        return LLMEngine(EngineConfig.from_options(model_dir, **options), tokenizer)

    # --- what outside code may ask of the engine ---------------------------------------------------------------

    @property
    def placeholder_ids(self) -> Any:
        return self.preparer.placeholder_ids

    @property
    def media_defaults(self) -> Any:
        return self.preparer.media_defaults

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def device(self) -> torch.device:
        return self.runner.device

    @property
    def weight_version(self) -> int:
        """The version of the weights now loaded (the encoder cache keys on it)."""
        return self.encoder_cache.weight_version

    def prepare(self, prompt: Prompt) -> VLMRequest:
        return self.preparer.prepare(prompt)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self._aborted)

    def has_runnable(self) -> bool:
        """A step now could produce something: unfinished requests not all held back by slow readers."""
        return bool(self._aborted) or self.scheduler.has_runnable()

    # --- requests ----------------------------------------------------------------------------------------------

    def add_request(self, request_id: str, prompt: Prompt,
                    params: SamplingParams | None = None, grammar: Any = COMPILE) -> None:
        """Prepare the prompt (PromptError / MediaError on bad input) and queue its n samples. `grammar`: the
        request's compiled grammar when the caller compiled it off the step loop (Grammars.submit / wait), else it
        is compiled here (blocking this caller, under the grammar deadline)."""
        if request_id in self.groups:
            raise ValueError(f"request id {request_id!r} is already in use")
        if (asleep := self.sleep_state.reason()) is not None:
            raise EngineAsleepError(asleep)
        params = params or SamplingParams()
        req = self.prepare(prompt)
        if len(req.prompt_token_ids) >= self.runtime.max_model_len:
            raise PromptError(f"prompt has {len(req.prompt_token_ids)} tokens; the context length is "
                              f"{self.runtime.max_model_len} (model limit, max_model_len and KV cache size)",
                              param="input_tokens")  # vLLM's name for it
        if params.routed_experts_prompt_start > len(req.prompt_token_ids):  # vLLM checks it with R3 off too
            raise PromptError(f"routed_experts_prompt_start must be between 0 and the prompt length "
                              f"({len(req.prompt_token_ids)}), inclusive", param="routed_experts_prompt_start")
        if grammar is COMPILE:
            grammar = self.compile_grammar(params)  # an invalid spec fails here, before anything is queued
        group = SequenceGroup(request_id, params, req, metrics=RequestMetrics(time.perf_counter()))
        group.seqs = [self._new_sequence(group, i, grammar) for i in range(params.n)]  # all built before queuing
        for seq in group.seqs:
            self.scheduler.add(seq)
        self.groups[request_id] = group

    def compile_grammar(self, params: SamplingParams) -> Any:
        """The request's compiled grammar (cached per spec), or None; GrammarError (a 400) for an invalid spec, one
        over the size cap, or one not compiled within the deadline. Blocks the caller: a loop that steps other
        requests uses `grammars.submit` / `grammars.wait` and passes the result to add_request."""
        return self.grammars.compile(params.structured_outputs)

    def _new_sequence(self, group: SequenceGroup, index: int, grammar: Any) -> Sequence:
        seq = Sequence(group, group.request.prompt_token_ids, index)
        seq.matcher = self.grammars.matcher(grammar)  # n samples share the compiled grammar, one matcher each
        seq.routing = RoutingRows() if self.runner.routing is not None else None
        p = seq.params
        seq.seed = p.seed if p.seed is not None else self._rng.getrandbits(63)
        if p.stop_list or (p.detokenize and p.output_kind is not RequestOutputKind.FINAL_ONLY):
            seq.detok = IncrementalDetokenizer(self._decode, p.skip_special_tokens, seq.num_prompt_tokens)
        return seq

    def _decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    # --- the loop ----------------------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run one scheduled batch; return the outputs it produced (per each request's output kind) and those of
        requests aborted since the last step. A failure is blamed on the requests that cause it: they end with
        finish_reason "error" and the others run on."""
        outputs, self._aborted = self._aborted, []
        batch = self.scheduler.schedule()
        self._check_batch(batch)
        if not batch.chunks:
            return outputs
        self.request_stats.scheduled(batch.chunks, time.perf_counter())
        try:
            result = self.runner.run(batch.chunks)
        except RankLostError:
            raise  # the ranks are out of step: no request is to blame, and no rerun can run
        except Exception as exc:
            error = step_failure(exc)
            with self.runner.states_frozen():  # the survivors' chunks are scheduled again: their states stay put
                blamed = culprits(self.runner.run, batch.chunks)
            return outputs + [self._end(g, "error", error) for g in blamed]
        self.scheduler.update(batch, result.routing)
        return outputs + self._postprocess(batch, result)

    def _check_batch(self, batch: SchedulerOutput) -> None:
        """Tensor-parallel ranks make sure they scheduled the same batch before its forward (parallel/); one
        process has nothing to check."""

    def _postprocess(self, batch: SchedulerOutput, result: StepOutput) -> list[RequestOutput]:
        """Record prompt logprobs, sample, append tokens and text, apply stop rules; outputs of advanced requests."""
        by_id = {c.seq.seq_id: c.seq for c in batch.chunks}
        for seq_id, scored in result.prompt_logprobs.items():
            by_id[seq_id].add_prompt_logprobs(*scored)
        seqs = [c.seq for c in result.sample_chunks]
        if not seqs:
            return []
        try:
            sampled = self.sampler(result.sample_logits, seqs, self.runner.batch, result.sample_rows)
        except Exception as exc:
            error = step_failure(exc)
            return [self._end(g, "error", error) for g in {id(s.group): s.group for s in seqs}.values()]
        now = time.perf_counter()
        advanced: dict[str, SequenceGroup] = {}
        failed: list[RequestOutput] = []
        for i, seq in enumerate(seqs):
            if seq.group.error is not None:
                continue
            if (error := self._append_or_error(seq, sampled, i)) is not None:
                advanced.pop(seq.group.request_id, None)
                failed.append(self._end(seq.group, "error", error))
                continue
            seq.group.metrics.first_token_time = seq.group.metrics.first_token_time or now
            self.request_stats.token(seq, now)
            advanced[seq.group.request_id] = seq.group
        return failed + [out for group in advanced.values() if (out := self._output_of(group)) is not None]

    def _append_or_error(self, seq: Sequence, sampled: SampleResult, i: int) -> RequestError | None:
        """Append row i's sample to seq; or why its request must fail (a non-finite row, a failure appending)."""
        if bad := sampled.nonfinite[i]:
            return NONFINITE_MODEL if bad == RAW_NONFINITE else NONFINITE_PARAMS
        try:
            self._append(seq, sampled.token_ids[i], sampled.logprobs[i], sampled.top_logprobs[i])
        except Exception as exc:
            return step_failure(exc)
        return None

    def _append(self, seq: Sequence, token: int, logprob: float, top: dict[int, float] | None) -> None:
        if seq.matcher is not None and not seq.matcher.accept_token(token):
            raise RuntimeError(f"the grammar rejected sampled token {token}")
        seq.token_ids.append(token)
        seq.logprobs.append(logprob)
        seq.cumulative_logprob += logprob
        if top is not None:
            seq.top_logprobs.append(top)
        if seq.detok is not None:
            seq.last_text_chars = len(seq.detok.push(seq.token_ids))
        stop = apply_stop_rules(seq, token, self.eos_ids, self._max_new(seq))
        if stop is None and seq.matcher is not None and seq.matcher.is_terminated():
            stop = ("stop", None)  # the grammar took its stop token (under ignore_eos too): the output is complete
        if stop is not None:
            seq.stop_reason = stop[1]
            self.scheduler.finish(seq, stop[0])

    def _max_new(self, seq: Sequence) -> int:
        cap = self.runtime.max_model_len - seq.num_prompt_tokens
        return min(seq.params.max_tokens or cap, cap)

    def _output_of(self, group: SequenceGroup) -> RequestOutput | None:
        """The group's output for this step (None for a running FINAL_ONLY request); releases finished groups."""
        out = None
        if group.finished or group.params.output_kind is not RequestOutputKind.FINAL_ONLY:
            out = make_output(group, self._decode)
        if group.finished:
            self._release(group)
        return out

    def _release(self, group: SequenceGroup) -> None:
        self.groups.pop(group.request_id, None)
        group.metrics.finished_time = time.perf_counter()
        self.request_stats.finished(group)

    # --- control -----------------------------------------------------------------------------------------------

    def abort(self, request_id: str) -> RequestOutput | None:
        """Stop a request now; its partial tokens/logprobs are reported with finish_reason "abort"."""
        group = self.groups.get(request_id)
        if group is None:
            return None
        group.aborted = True
        out = self._end(group, "abort")
        self._aborted.append(out)
        return out

    def _end(self, group: SequenceGroup, reason: str, error: RequestError | None = None) -> RequestOutput:
        """Finish every sample of the group now (freeing its blocks) and release it; its last output."""
        group.error = error
        for seq in group.seqs:
            self.scheduler.finish(seq, reason)
        out = make_output(group, self._decode)
        self._release(group)
        return out

    def abort_many(self, request_ids: Iterable[str]) -> None:
        for rid in request_ids:
            self.abort(rid)

    def named_parameters(self) -> Iterable[tuple[str, torch.Tensor]]:
        """The loaded model's parameters by our module names (refits are checked against these)."""
        return self.model.named_parameters()

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> set[str]:
        """Load new weights in place; every weight-derived cache (encoder outputs, prefix KV) is dropped. Returns
        the parameters filled."""
        from mm_infer.models import load_state_dict_into

        if self.sleep_state.weights == "discarded":
            raise EngineAsleepError("the weights were discarded by a level-2 sleep: POST /wake_up?tags=weights "
                                    "before loading new ones")
        filled = load_state_dict_into(self.model, named_tensors)
        self.encoder_cache.set_weight_version(version)
        self.block_manager.reset_prefix_cache()
        self.sleep_state.note_refit(filled, {name for name, _ in self.model.named_parameters()})
        return filled

    def sleep(self, level: int) -> SleepState:
        """vLLM's sleep levels (engine/control/sleep.py); the engine must be idle."""
        return sleep(self, level)

    def wake_up(self, tags: Iterable[str] | None = None) -> SleepState:
        return wake_up(self, tags)

    def close(self) -> None:
        """Release the KV pool, decode graphs, state pool, encoder cache and weights now, not at the next garbage
        collection (reference cycles hold an engine until then); the engine cannot step afterwards."""
        self.encoder_cache.clear()
        self.runner.release()
        self.model = None  # type: ignore[assignment]
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def reset_caches(self) -> None:
        """Forget cached vision embeddings and prefix KV (running requests keep their own blocks)."""
        self.encoder_cache.clear()
        self.block_manager.reset_prefix_cache()

    def stats(self) -> dict[str, float]:
        """Gauges and counters now, vLLM's request series (request_stats.PREFIX keys) and the cache config."""
        bm, cache = self.block_manager, self.config.cache
        return {"encoder_calls": self.runner.encoder_calls, "encoder_cache_hits": self.encoder_cache.stats.hits,
                "prefix_query_tokens": bm.stats.queries, "prefix_hit_tokens": bm.stats.hits,
                "preemptions": self.scheduler.num_preemptions, "free_blocks": bm.num_free_blocks,
                "num_blocks": bm.num_blocks, "num_waiting": self.num_waiting, "num_running": self.num_running,
                **self.request_stats.snapshot(), "cache_config|block_size": cache.block_size,
                "cache_config|enable_prefix_caching": float(cache.enable_prefix_caching),
                "cache_config|gpu_memory_utilization": cache.gpu_memory_utilization,
                "cache_config|num_gpu_blocks": bm.num_blocks, **self._state_stats()}

    def _state_stats(self) -> dict[str, float]:
        """Hybrid models: the recurrent-state slots free and in use, snapshots kept and restored."""
        states = self.block_manager.states
        if states is None:
            return {}
        return {"state_live_free": len(states.free_live), "state_live_slots": states.live,
                "state_snapshots_held": len(states.owner), "state_snapshot_slots": states.snapshots,
                "state_snapshots_taken": states.stats.snapshots_taken, "state_restores": states.stats.restores,
                "state_snapshots_evicted": states.stats.snapshots_evicted}
