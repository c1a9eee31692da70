"""Bodies of the weight-transfer routes, with vLLM's field names (unknown fields are ignored, as vLLM does)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from mm_infer.transfer.packing import DEFAULT_BUFFER_BYTES, DEFAULT_NUM_BUFFERS

MAX_TIMEOUT_S = 3600.0  # the longest a rendezvous or one broadcast may be told to wait


class Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class InitInfo(Lenient):
    master_address: str
    master_port: int = Field(ge=1, le=65535)
    rank_offset: int = Field(ge=1)  # rank 0 is the trainer
    world_size: int = Field(ge=2)
    packed: bool = False
    packed_buffer_size_bytes: int = Field(default=DEFAULT_BUFFER_BYTES, ge=1)
    packed_num_buffers: int = Field(default=DEFAULT_NUM_BUFFERS, ge=1)
    # ours: how long the rendezvous and each broadcast may wait (a 400 past MAX_TIMEOUT_S)
    timeout_s: float = Field(default=300.0, gt=0, le=MAX_TIMEOUT_S)
    nccl_unique_id_b64: str | None = None

    @field_validator("nccl_unique_id_b64")
    @classmethod
    def _no_unique_id(cls, value: str | None) -> str | None:
        if value:
            raise ValueError("the unique-id rendezvous is not supported: give master_address and master_port")
        return value


class InitRequest(Lenient):
    init_info: InitInfo


class UpdateInfo(Lenient):
    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]
    packed: bool | None = None  # None: as init_info said
    packed_buffer_size_bytes: int | None = Field(default=None, ge=1)


class UpdateRequest(Lenient):
    update_info: UpdateInfo


class FinishRequest(Lenient):
    weight_version: int | str | None = None  # vLLM allows any string; ours are integers ("7" is read as 7)


class TransferReply(BaseModel):
    message: str
    weight_version: int | None = None
    num_tensors: int | None = None
