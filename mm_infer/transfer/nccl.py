"""NCCL broadcast groups over ctypes, rendezvous-compatible with vLLM's StatelessProcessGroup + PyNcclCommunicator.

Rank 0 (the trainer) serves a TCPStore, puts its pickled ncclUniqueId under "broadcast_from/0/0", every rank calls
ncclCommInitRank and then a one-element float all_reduce (vLLM's warm-up). So TRL or vLLM's trainer helpers on
rank 0 and these engines on the other ranks form one group. CUDA only: nothing here runs on the CPU build."""

from __future__ import annotations

import ctypes
import glob
import io
import os
import pickle
from typing import Any

import torch
from torch import Tensor

from mm_infer.transfer.rendezvous import tcp_store

UID_KEY = "broadcast_from/0/0"  # StatelessProcessGroup.broadcast_obj's first key from rank 0
VLLM_UID_CLASS = ("vllm.distributed.device_communicators.pynccl_wrapper", "ncclUniqueId")
NCCL_DTYPES = {torch.int8: 0, torch.uint8: 1, torch.int32: 2, torch.int64: 4, torch.float16: 6, torch.float32: 7,
               torch.float64: 8, torch.bfloat16: 9}


class UniqueId(ctypes.Structure):
    """ncclUniqueId: 128 opaque bytes (the same layout as vLLM's)."""

    _fields_ = [("internal", ctypes.c_byte * 128)]


class _UidUnpickler(pickle.Unpickler):
    """Reads a pickled ncclUniqueId (vLLM's class or ours) and nothing else: the store is network input."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("_ctypes", "_unpickle"):
            import _ctypes

            return _ctypes._unpickle
        if (module, name) == ("_codecs", "encode"):  # protocol 2 spells bytes as codecs.encode(text, "latin1")
            import _codecs

            return _codecs.encode
        if (module, name) in (VLLM_UID_CLASS, (__name__, "UniqueId")):
            return UniqueId
        raise pickle.UnpicklingError(f"the transfer store holds {module}.{name}, not an ncclUniqueId")


def load_unique_id(data: bytes) -> UniqueId:
    uid = _UidUnpickler(io.BytesIO(data)).load()
    if not isinstance(uid, UniqueId):
        raise pickle.UnpicklingError(f"expected an ncclUniqueId, got {type(uid).__name__}")
    return uid


def dump_unique_id(uid: UniqueId) -> bytes:
    """Pickled under vLLM's class name (protocol 2 spells globals out), so vLLM engines can read ours too."""
    ours = f"c{__name__}\nUniqueId\n".encode()
    return pickle.dumps(uid, protocol=2).replace(ours, "c{}\n{}\n".format(*VLLM_UID_CLASS).encode())


def _library() -> ctypes.CDLL:
    """libnccl.so.2: $MM_INFER_NCCL_SO, else the loader's, else the nvidia-nccl wheel torch ships with."""
    names = [os.environ.get("MM_INFER_NCCL_SO", ""), "libnccl.so.2"]
    names += glob.glob(os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "nccl", "lib", "libnccl.so*"))
    errors = []
    for name in filter(None, names):
        try:
            return ctypes.CDLL(name)
        except OSError as e:
            errors.append(str(e))
    raise RuntimeError(f"the nccl weight transfer backend needs libnccl.so.2 ({'; '.join(errors)})")


class NcclGroup:
    """One NCCL communicator on `device`; broadcasts run on the current CUDA stream and are waited for."""

    def __init__(self, master_address: str, master_port: int, rank: int, world_size: int,
                 timeout_s: float = 300.0, device: torch.device | None = None) -> None:
        if not torch.cuda.is_available():
            raise RuntimeError("the nccl weight transfer backend needs CUDA; use gloo on CPU")
        self.rank, self.world_size = rank, world_size
        self.device = device or torch.device("cuda", torch.cuda.current_device())
        self._lib = _library()
        self._store = tcp_store(master_address, master_port, rank, world_size, timeout_s)
        uid = UniqueId()
        if rank == 0:
            self._check(self._lib.ncclGetUniqueId(ctypes.byref(uid)))
            self._store.set(UID_KEY, dump_unique_id(uid))
        else:
            uid = load_unique_id(self._store.get(UID_KEY))
        self._comm = ctypes.c_void_p()
        with torch.cuda.device(self.device):
            self._check(self._lib.ncclCommInitRank(ctypes.byref(self._comm), world_size, uid, rank))
            warm = torch.zeros(1, device=self.device)  # [1] float32: vLLM's warm-up all_reduce
            stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
            self._check(self._lib.ncclAllReduce(ctypes.c_void_p(warm.data_ptr()), ctypes.c_void_p(warm.data_ptr()),
                                                ctypes.c_size_t(1), NCCL_DTYPES[torch.float32], 0, self._comm,
                                                stream))
            torch.cuda.current_stream().synchronize()

    def _check(self, result: int) -> None:
        if result != 0:
            self._lib.ncclGetErrorString.restype = ctypes.c_char_p
            raise RuntimeError(f"NCCL error {result}: {self._lib.ncclGetErrorString(result).decode()}")

    def broadcast(self, tensor: Tensor, src: int = 0) -> None:
        if tensor.device != self.device or not tensor.is_contiguous():
            raise ValueError(f"broadcast needs a contiguous tensor on {self.device}, got {tensor.device}")
        ptr = ctypes.c_void_p(tensor.data_ptr())
        stream = torch.cuda.current_stream(self.device)
        self._check(self._lib.ncclBroadcast(ptr, ptr, ctypes.c_size_t(tensor.numel()), NCCL_DTYPES[tensor.dtype],
                                            src, self._comm, ctypes.c_void_p(stream.cuda_stream)))
        stream.synchronize()

    def close(self) -> None:
        if self._comm:
            self._lib.ncclCommDestroy(self._comm)
            self._comm = ctypes.c_void_p()
