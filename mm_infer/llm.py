"""Offline API: LLM(model_dir, dtype="auto", **engine_options).generate(prompts, sampling_params)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from mm_infer.engine.open_engine import open_engine
from mm_infer.engine.outputs.request_output import RequestOutput
from mm_infer.engine.sampling.params import SamplingParams
from mm_infer.prompt.preparer import Prompt


def pair_prompts(prompts: Prompt | Sequence[Prompt], sampling_params: SamplingParams | Sequence[SamplingParams] | None
                 ) -> tuple[Sequence[Prompt], list[SamplingParams]]:
    """One prompt or many, with one SamplingParams for all or one each (vLLM's generate() conventions)."""
    if isinstance(prompts, (str, Mapping)):
        prompts = [prompts]
    params = sampling_params if sampling_params is not None else SamplingParams()
    params = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
    if len(params) != len(prompts):
        raise ValueError(f"{len(params)} sampling params for {len(prompts)} prompts")
    return prompts, params


def prepare_all(prepare: Callable[[Prompt], Any], prompts: Sequence[Prompt]) -> list:
    """Decode media and tokenize every prompt on a thread pool (PIL, PyAV and torch release the GIL)."""
    workers = min(len(prompts), os.cpu_count() or 1)
    if workers <= 1:
        return [prepare(p) for p in prompts]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="mm-prepare") as pool:
        return list(pool.map(prepare, prompts))


class LLM:
    """Load once, then generate for whole prompt lists with continuous batching."""

    def __init__(self, model_dir: str, dtype: str = "auto", tokenizer: Any = None, **engine_options: Any) -> None:
        start = time.perf_counter()
        self.engine = open_engine(model_dir, tokenizer=tokenizer, dtype=dtype, **engine_options)
        self.startup_seconds = time.perf_counter() - start
        self._counter = 0

    def close(self) -> None:
        """Stop what the engine runs outside this process (its tensor-parallel ranks)."""
        self.engine.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def get_tokenizer(self) -> Any:
        return self.engine.tokenizer

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """One RequestOutput per prompt, in order."""
        prompts, params = pair_prompts(prompts, sampling_params)
        requests = prepare_all(self.engine.prepare, prompts)  # bad input fails before anything is queued
        ids: list[str] = []
        try:
            for req, p in zip(requests, params, strict=True):
                ids.append(f"gen-{self._counter}")
                self._counter += 1
                self.engine.add_request(ids[-1], req, p.final_only())
        except Exception:
            self.engine.abort_many(ids)
            raise
        return self._run(ids, use_tqdm)

    def _run(self, ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        done: dict[str, RequestOutput] = {}
        wanted = set(ids)
        bar = None
        if use_tqdm:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(ids), desc="Processed prompts", dynamic_ncols=True)
        try:
            while len(done) < len(ids) and self.engine.has_unfinished():
                for out in self.engine.step():
                    if out.finished and out.request_id in wanted and out.request_id not in done:
                        done[out.request_id] = out
                        if bar is not None:
                            bar.update(1)
        finally:
            if bar is not None:
                bar.close()
        return [done[i] for i in ids]

    @property
    def weight_version(self) -> int:
        return self.engine.weight_version

    def sleep(self, level: int = 1) -> None:
        """vLLM's sleep: level 1 frees the KV pool and encoder cache and offloads the weights to host memory;
        level 2 discards the weights too (wake_up, then update_weights every weight, before generating)."""
        self.engine.sleep(level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Bring back what `tags` names: "weights", "kv_cache" (default: both)."""
        self.engine.wake_up(tags)

    def update_weights(self, named_tensors: Any, version: int | None = None) -> int:
        """Load (HF name, tensor) pairs in place, either naming layout; bumps and returns weight_version.

        Encoder and prefix caches are invalidated. Pause or finish running requests first: a request
        already running keeps the KV it computed with the old weights.
        """
        version = self.engine.weight_version + 1 if version is None else version
        self.engine.update_weights(named_tensors, version)
        return version

    def update_weights_from_disk(self, model_dir: str, version: int | None = None,
                                 bucket_bytes: int = 256 * 1024 * 1024) -> int:
        """update_weights from a safetensors folder (sharded or not): every name and shape is checked from
        the file headers first (WeightFileError, nothing loaded), then tensors are read in byte-bounded buckets."""
        from mm_infer.rl.weights import plan_refit, read_buckets

        entries = plan_refit(model_dir, self.engine.model)
        version = self.engine.weight_version + 1 if version is None else version
        for bucket in read_buckets(entries, bucket_bytes):
            self.engine.update_weights(bucket, version)
        return version
