"""ReplicaPool: N engine replicas (Ray actors) behind a router; the server's EngineBackend for `--replicas N`."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Mapping
from dataclasses import replace
from typing import Any

import ray
from ray.exceptions import RayActorError, RayError, RayTaskError

from mm_infer.config import EngineConfig
from mm_infer.distributed.counters import pool_counters
from mm_infer.distributed.errors import ReplicaUnavailableError, describe_failure
from mm_infer.distributed.media_refs import MediaRefCache
from mm_infer.distributed.pool_control import PoolControl
from mm_infer.distributed.router import Router, affinity_key
from mm_infer.distributed.slots import PoolConfig
from mm_infer.distributed.supervisor import Supervisor
from mm_infer.engine.control.ops import ControlOp
from mm_infer.engine.control.sleep_state import SleepState
from mm_infer.engine.outputs.edge import OutputEdge, wire_kind
from mm_infer.engine.outputs.request_output import RequestOutput
from mm_infer.engine.sampling.params import SamplingParams
from mm_infer.prompt.inputs import PromptInput
from mm_infer.prompt.preparer import PromptPreparer
from mm_infer.prompt.request import VLMRequest
from mm_infer.serving import BackendFacts, MetaReference, engine_gauges


def ensure_ray(config: PoolConfig) -> bool:
    """Connect to `ray_address`, or start a local Ray with a slot per replica; True if this call started it."""
    if ray.is_initialized():
        return False
    if config.ray_address:
        ray.init(address=config.ray_address, log_to_driver=False)
        return True
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    ray.init(num_cpus=max(cores, int(config.num_replicas * config.ranks * config.num_cpus_per_replica + 0.999)),
             include_dashboard=False, log_to_driver=False)
    return True


def _unwrap(exc: RayTaskError) -> BaseException:
    """The replica's own exception (PromptError, MediaError, ...) so the server maps it to its 4xx."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc


class ReplicaPool(MetaReference):
    """Prepares prompts here (media preprocessed once, shipped once through the object store), routes each request
    to one replica, streams its snapshots back, and fans refits, freezes and cache resets out to every replica."""

    def __init__(self, config: PoolConfig) -> None:
        self._owns_ray = ensure_ray(config)
        if config.num_gpus_per_replica is None:  # the cluster's GPUs, not this node's: a head node may have none
            gpus = 1.0 if ray.cluster_resources().get("GPU", 0) >= 1 else 0.0  # per rank
            config = PoolConfig(**{**config.__dict__, "num_gpus_per_replica": gpus})
        self.config = config
        engine_config = EngineConfig.from_options(config.model_dir, **config.engine_options)
        self.preparer = PromptPreparer(config.model_dir, engine_config.media)
        self.router = Router(config.num_replicas, config.spill_slack)
        self.supervisor = Supervisor(config, self.router)
        self._inflight: dict[str, tuple[int, Any]] = {}  # request id -> (replica index, actor handle)
        self.media = MediaRefCache(config.media_cache_bytes)
        self._closed = False
        self.pool_control = PoolControl(self.supervisor, self._fan_out, engine_config.weight_version)
        self.supervisor.start_all()
        info = self.supervisor.slots[0].info
        self.facts = BackendFacts(int(info["max_model_len"]), int(info["vocab_size"]), config.num_replicas)

    # EngineBackend: live state
    @property
    def is_alive(self) -> bool:
        return not self._closed and bool(self.supervisor.up_slots())

    @property
    def weight_version(self) -> int:
        return self.pool_control.version

    @property
    def sleep_state(self) -> SleepState:
        return self.pool_control.sleep_state

    def prepare(self, prompt: str | Mapping[str, Any] | PromptInput) -> VLMRequest:
        return self.preparer.prepare(prompt)

    # requests
    def _route(self, key: str, weight: int) -> tuple[int, Any, int]:
        """(index, actor handle, incarnation) of an up replica; its router load already counts `weight`."""
        for _ in range(4 * self.config.num_replicas):
            index = self.router.pick(key, weight)
            with self.supervisor.lock:  # the supervisor may have taken it down since the router saw it up
                slot = self.supervisor.slots[index]
                if slot.state == "up":
                    return index, slot.handle, slot.incarnation
            self.router.release(index, weight)
        raise ReplicaUnavailableError("no engine replica stayed up long enough to take the request; retry shortly")

    def _died(self, index: int, incarnation: int, exc: BaseException, request_id: str) -> ReplicaUnavailableError:
        reason = describe_failure(exc)
        if not self.supervisor.mark_down(index, incarnation, reason):  # the supervisor knew first: its reason
            reason = self.supervisor.slots[index].last_failure or reason
        return ReplicaUnavailableError(
            f"engine replica {index} failed while serving request {request_id!r} ({reason}); the request was not "
            "completed and was not retried: send it again")

    async def generate(self, prompt: str | Mapping[str, Any] | PromptInput | VLMRequest, params: SamplingParams | None,
                       request_id: str, affinity: str | None = None, stream: bool = True
                       ) -> AsyncIterator[RequestOutput]:
        """Outputs per params.output_kind from the replica the request was routed to (without `stream`: the final
        one only, from one plain actor call). A replica that dies under it ends the stream with
        ReplicaUnavailableError (503); the request is not retried elsewhere."""
        params = params or SamplingParams()
        if not stream:
            params = params.final_only()
        edge = OutputEdge(params.output_kind)  # replicas stream joined deltas; the reader's kind is built here
        params = replace(params, output_kind=wire_kind(params.output_kind))
        req = await asyncio.to_thread(self.preparer.prepare, prompt)
        key = affinity_key(req, affinity)
        light, media = self.media.detach(req)  # pixels by reference, once per content hash; the rest inline
        index, handle, incarnation = self._route(key, params.n)
        self._inflight[request_id] = (index, handle)
        finished = False
        call: Any = None
        try:
            if not stream:
                call = handle.generate_final.remote(light, media, params, request_id, key)
                out: RequestOutput = await call
                finished = out.finished
                yield out
                return
            call = handle.generate.options(num_returns="streaming").remote(light, media, params, request_id, key)
            async for out_ref in call:
                out = await out_ref
                finished = out.finished
                yield edge.take(out)
                if finished:
                    return
            raise ReplicaUnavailableError(f"replica {index} ended request {request_id!r} without a final output")
        except RayTaskError as exc:
            raise _unwrap(exc) from None
        except RayActorError as exc:  # the actor died or cannot be reached: it leaves routing now
            raise self._died(index, incarnation, exc, request_id) from None
        except RayError as exc:  # lost objects and the like: this request fails, the replica stays
            raise ReplicaUnavailableError(f"request {request_id!r} failed on engine replica {index} "
                                          f"({describe_failure(exc)}); send it again") from None
        finally:
            self._inflight.pop(request_id, None)
            self.router.release(index, params.n)
            if not finished:
                self._abandon(handle, call, request_id)

    @staticmethod
    def _abandon(handle: Any, call: Any, request_id: str) -> None:
        """Stop a request nobody waits for: cancel the actor call (also before it ran, which an abort message could
        overtake) and abort it in the engine. Both are fire and forget."""
        try:
            if call is not None:
                ray.cancel(call)
            handle.abort.remote(request_id)
        except RayError:
            pass

    def abort(self, request_id: str) -> None:
        """Abort on the replica serving it; its stream then ends with finish_reason "abort"."""
        found = self._inflight.get(request_id)
        if found is not None:
            try:
                found[1].abort.remote(request_id)
            except RayError:
                pass

    # fan-out to every replica
    async def _fan_out(self, method: str, *args: Any) -> list[Any]:
        """Call `method` on every up replica; the first replica-side error is raised once all have answered. A
        replica that died meanwhile is left to the supervisor, which restarts it in the current state."""
        slots = self.supervisor.up_slots()
        refs = [getattr(slot.handle, method).remote(*args) for slot in slots]
        results = await asyncio.gather(*refs, return_exceptions=True)
        failed = None
        for slot, result in zip(slots, results, strict=True):
            if isinstance(result, RayTaskError):
                failed = failed or _unwrap(result)
            elif isinstance(result, RayError):
                self.supervisor.mark_down(slot.index, slot.incarnation, describe_failure(result))
        if failed is not None:
            raise failed
        return [r for r in results if not isinstance(r, BaseException)]

    async def control(self, op: ControlOp) -> Any:
        """Apply `op` on every replica (pool_control.py: the refit journal and how answers merge)."""
        return await self.pool_control.apply(op)

    # observability
    def engine_gauges(self) -> dict[str, float]:
        """Sums of the replicas' last health-check gauges and of their counters (carried over restarts, so they
        never go down), plus routing and replica counts."""
        slots = self.supervisor.slots
        now = {k: sum(float(s.gauges.get(k, 0)) for s in slots)
               for k in ("num_waiting", "num_running", "free_blocks", "num_blocks")}
        with self.supervisor.lock:
            counted = pool_counters(self.supervisor.counters)
        stats = self.router.stats
        config = next(({k: v for k, v in s.gauges.items() if k.startswith("cache_config|")} for s in slots
                       if s.state == "up"), {})  # the replicas share one cache config: the first up one's
        return {**engine_gauges({**now, **counted, **config}), "replicas": float(len(slots)),
                "replicas_up": float(sum(s.state == "up" for s in slots)),
                "replica_restarts": float(sum(s.restarts for s in slots)),
                "router_affinity_hit_rate": stats.hit_rate, "router_spills": float(stats.spills)}

    def counters(self) -> list[dict[str, Any]]:
        """Each up replica's own counters (requests, requests per affinity key, engine stats)."""
        return ray.get([s.handle.counters.remote() for s in self.supervisor.up_slots()])

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.supervisor.stop()
        if self._owns_ray:
            ray.shutdown()
