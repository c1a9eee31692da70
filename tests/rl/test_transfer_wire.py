"""The weight-transfer wire format (vLLM's packed chunks) and the NCCL rendezvous object vLLM's trainer writes."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch

from mm_infer.transfer.nccl import UniqueId, dump_unique_id, load_unique_id
from mm_infer.transfer.packing import TensorMeta, chunk_plan, dtype_named, pack, packed_chunks, unpack

VLLM_UID = Path(__file__).with_name("data") / "vllm_nccl_unique_id.pkl"  # pickle.dumps(vLLM's ncclUniqueId)


def _metas(*sizes: int) -> list[TensorMeta]:
    return [TensorMeta(f"t{i}", torch.uint8, (n,)) for i, n in enumerate(sizes)]


def test_chunks_close_once_past_the_buffer_as_vllm_cuts_them():
    assert chunk_plan(_metas(4, 4, 4, 4), 8) == [[0, 1, 2], [3]]  # 12 > 8 closes the first chunk
    assert chunk_plan(_metas(20, 1), 8) == [[0], [1]]  # one tensor larger than the buffer travels alone
    assert chunk_plan(_metas(3, 3), 100) == [[0, 1]]
    assert chunk_plan([], 8) == []


def test_pack_then_unpack_gives_back_every_dtype_and_shape():
    gen = torch.Generator().manual_seed(0)
    tensors = [torch.randn(3, 5, generator=gen).to(torch.bfloat16), torch.arange(7, dtype=torch.int64),
               torch.randn(4, 2, generator=gen).t()]  # a non-contiguous view travels as its values
    metas = [TensorMeta(f"w{i}", t.dtype, tuple(t.shape)) for i, t in enumerate(tensors)]
    buf = pack(tensors)
    assert buf.dtype == torch.uint8 and buf.numel() == sum(m.nbytes for m in metas)
    for (name, got), want, meta in zip(unpack(buf, metas), tensors, metas, strict=True):
        assert name == meta.name and torch.equal(got, want)


def test_the_sender_refuses_a_tensor_that_is_not_the_announced_one():
    metas = [TensorMeta("a", torch.float32, (2,))]
    with pytest.raises(ValueError, match="announced 'a'"):
        list(packed_chunks(iter([("a", torch.zeros(3))]), metas, 1 << 20))


def test_dtype_names_are_torch_names_only():
    assert dtype_named("bfloat16") is torch.bfloat16
    for bad in ("floaty", "Tensor", "nn"):
        with pytest.raises(ValueError, match=repr(bad)):
            dtype_named(bad)


def test_the_unique_id_vllm_pickles_loads_and_ours_reads_back():
    uid = load_unique_id(VLLM_UID.read_bytes())
    want = bytes(((i * 7) % 128 - 64) & 0xFF for i in range(128))  # what the fixture was made with
    assert bytes(uid.internal) == want
    assert bytes(load_unique_id(dump_unique_id(uid)).internal) == want
    assert b"vllm.distributed.device_communicators.pynccl_wrapper" in dump_unique_id(UniqueId())


def test_the_store_may_hold_an_ncclUniqueId_and_nothing_else():
    with pytest.raises(pickle.UnpicklingError, match="os.system"):
        load_unique_id(b"cos\nsystem\n(S'true'\ntR.")
