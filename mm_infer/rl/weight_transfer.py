"""WeightTransferClient: the trainer's end (rank 0) of vLLM's weight-transfer API, against mm-infer or vLLM.

    client = WeightTransferClient("http://127.0.0.1:8000", backend="gloo")   # "nccl" with CUDA tensors
    client.init()                              # GET /get_world_size, join the group with every engine
    client.send(model.named_parameters())      # start, update (packed broadcast), finish: the new version
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import httpx
import torch
from torch import Tensor

from mm_infer.transfer.collective import BroadcastGroup, join_group
from mm_infer.transfer.packing import DEFAULT_BUFFER_BYTES, TensorMeta, dtype_name, packed_chunks


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class SendReport:
    weight_version: int
    num_tensors: int
    num_bytes: int
    seconds: float  # start_weight_update .. finish_weight_update answered


class _Call(threading.Thread):
    """One blocking HTTP call on a side thread (the server's side of a collective runs inside it)."""

    def __init__(self, http: httpx.Client, path: str, body: dict[str, Any]) -> None:
        super().__init__(daemon=True)
        self.http, self.path, self.body = http, path, body
        self.response: httpx.Response | None = None
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self.response = self.http.post(self.path, json=self.body)
        except BaseException as e:  # noqa: BLE001 - re-raised by result()
            self.error = e

    def result(self) -> dict[str, Any]:
        self.join()
        if self.error is not None:
            raise self.error
        assert self.response is not None
        return _checked(self.response)


def _checked(response: httpx.Response) -> dict[str, Any]:
    if response.status_code >= 400:
        raise RuntimeError(f"{response.request.method} {response.request.url.path} answered "
                           f"{response.status_code}: {response.text}")
    return response.json()


class WeightTransferClient:
    """Joins the server's engines as rank 0 and broadcasts named tensors in vLLM's packed format."""

    def __init__(self, base_url: str, backend: str = "gloo", api_key: str | None = None, timeout_s: float = 300.0,
                 packed: bool = True, buffer_bytes: int = DEFAULT_BUFFER_BYTES) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s)
        self.backend, self.timeout_s, self.packed, self.buffer_bytes = backend, timeout_s, packed, buffer_bytes
        self.group: BroadcastGroup | None = None

    def init(self, master_address: str = "127.0.0.1", master_port: int | None = None,
             device: torch.device | None = None) -> int:
        """Open the group (this process serves its TCPStore) while the server's engines join; returns its size."""
        world = _checked(self.http.get("/get_world_size"))["world_size"] + 1
        port = master_port or free_port(master_address)
        info = {"master_address": master_address, "master_port": port, "rank_offset": 1, "world_size": world,
                "packed": self.packed, "packed_buffer_size_bytes": self.buffer_bytes, "timeout_s": self.timeout_s}
        call = _Call(self.http, "/init_weight_transfer_engine", {"init_info": info})
        self.group = join_group(self.backend, master_address, port, 0, world, self.timeout_s, device)
        call.result()
        return world

    def send(self, named: Iterable[tuple[str, Tensor]], weight_version: int | None = None) -> SendReport:
        """One round: /start_weight_update, /update_weights beside the broadcast, /finish_weight_update."""
        if self.group is None:
            raise RuntimeError("call init() first")
        pairs = [(name.removeprefix("module."), t.detach()) for name, t in named]  # DDP / FSDP1 prefixes
        metas = [TensorMeta(name, t.dtype, tuple(t.shape)) for name, t in pairs]
        start = time.perf_counter()
        _checked(self.http.post("/start_weight_update", json={"is_checkpoint_format": True}))
        info = {"names": [m.name for m in metas], "dtype_names": [dtype_name(m.dtype) for m in metas],
                "shapes": [list(m.shape) for m in metas], "packed": self.packed,
                "packed_buffer_size_bytes": self.buffer_bytes}
        call = _Call(self.http, "/update_weights", {"update_info": info})
        call.join(0.05)  # a request refused before any broadcast (a 400 naming a tensor): no broadcast to hang in
        if not call.is_alive():
            call.result()
        sent = self._broadcast(pairs, metas)
        call.result()
        body = {} if weight_version is None else {"weight_version": weight_version}
        done = _checked(self.http.post("/finish_weight_update", json=body))
        return SendReport(done["weight_version"], len(metas), sent, time.perf_counter() - start)

    def _broadcast(self, pairs: list[tuple[str, Tensor]], metas: list[TensorMeta]) -> int:
        assert self.group is not None
        device, sent = self.group.device, 0
        if self.packed:
            chunks = packed_chunks(((n, t.to(device)) for n, t in pairs), metas, self.buffer_bytes)
        else:
            chunks = (t.to(device).contiguous() for _, t in pairs)
        for chunk in chunks:
            self.group.broadcast(chunk, src=0)
            sent += chunk.numel() * chunk.element_size()
        return sent

    def close(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None
        self.http.close()
