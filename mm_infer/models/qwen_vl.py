"""Top-level Qwen2-VL / Qwen2.5-VL / Qwen3-VL / Qwen3.5 model: vision tower + merger, M-RoPE LM (DeepStack; Qwen3.5's
hybrid LM with its recurrent state), LM head."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from mm_infer.media.frame_batch import FrameBatch
from mm_infer.models.attention import AttentionContext, DenseAttentionContext
from mm_infer.models.config import ModelConfig
from mm_infer.models.half_linear import Linear, linear
from mm_infer.models.language import DeepStack, TextModel
from mm_infer.models.moe import SparseMoE
from mm_infer.models.routing_capture import RoutingCapture
from mm_infer.models.vision import Qwen2VisionTower
from mm_infer.models.vision_qwen3 import Qwen3VisionTower
from mm_infer.models.vision_qwen25 import Qwen25VisionTower

TOWERS: dict[str, type[nn.Module]] = {"qwen2_vl": Qwen2VisionTower, "qwen2_5_vl": Qwen25VisionTower,
                                      "qwen3_vl": Qwen3VisionTower}


def scatter_embeddings(inputs_embeds: Tensor, mask: Tensor, embeds: Tensor, what: str = "media") -> Tensor:
    """Write embeds [K, D] into the rows of inputs_embeds [N, D] where mask [N] is True, in order."""
    n = int(mask.sum())
    if n != embeds.shape[0]:
        raise ValueError(f"{what}: {n} placeholder tokens but {embeds.shape[0]} embeddings")
    out = inputs_embeds.clone()
    out[mask] = embeds.to(out.dtype)
    return out


class QwenVLModel(nn.Module):
    """Flat, unpadded batches in; the KV cache (if any) lives behind the AttentionContext."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.visual = TOWERS[config.vision.kind](config.vision)
        self.deepstack_layers = len(config.vision.deepstack_visual_indexes)  # 0 before Qwen3-VL
        self.language: nn.Module = TextModel(config.text)
        if config.qwen35 is not None:  # Qwen3.5: gated DeltaNet layers beside full attention
            from mm_infer.models.qwen35 import Qwen35TextModel, qwen35_target

            self.language = Qwen35TextModel(config)
            self.tensor_target = qwen35_target  # the loader's name mapping: mtp.* skipped by name
        self.lm_head = (
            None
            if config.tie_word_embeddings
            else Linear(config.text.hidden_size, config.text.vocab_size, bias=False)
        )
        self.vocab_parallel: Callable[[Tensor, Tensor], Tensor] | None = None  # tensor parallelism: logits by rows

    @property
    def dtype(self) -> torch.dtype:
        return self.language.embed_tokens.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.language.embed_tokens.weight.device

    @property
    def has_recurrent_state(self) -> bool:
        """Qwen3.5: its DeltaNet layers keep a state per sequence (the engine's state pool)."""
        return self.config.qwen35 is not None

    @property
    def scan_chunk(self) -> int:
        from mm_infer.models.qwen35_config import GDN_CHUNK

        return GDN_CHUNK

    def state_pool(self, slots: int):  # noqa: ANN201 - a StatePool (Qwen3.5 only)
        return self.language.state_pool(slots)

    def state_bytes_per_slot(self) -> int:
        from mm_infer.models.recurrent_batch import StatePool

        return StatePool.bytes_per_slot(self.language.state_shapes(), self.dtype)

    def capture_routing(self, rows: int) -> RoutingCapture | None:
        """Has every MoE layer write its top-k expert ids for up to `rows` batch rows into one buffer (R3), and
        returns it; None when the model has no MoE layer (or is hybrid: not built for Qwen3.5 yet)."""
        moe = [m for m in self.modules() if isinstance(m, SparseMoE)]
        if not moe or self.has_recurrent_state:
            return None
        cfg = self.config.text.moe
        capture = RoutingCapture(rows, self.config.text.num_layers, cfg.top_k, cfg.num_experts, self.device)
        for m in moe:
            m.capture = capture
        return capture

    def embed_tokens(self, input_ids: Tensor) -> Tensor:
        """input_ids [N] -> [N, D]."""
        return self.language.embed_tokens(input_ids)

    def encode_vision(self, pixel_values: Tensor, grid_thw: Tensor | list) -> Tensor:
        """pixel_values [P, C*T*ph*pw], grid_thw [M, 3] -> [sum(t*h*w)/merge^2, (1 + deepstack_layers) * D].

        The grid is host metadata: pass a list to keep a device tensor's grid from costing a host sync.
        """
        grid = grid_thw.reshape(-1, 3).tolist() if isinstance(grid_thw, Tensor) else [list(g) for g in grid_thw]
        patches = sum(t * h * w for t, h, w in grid)
        if patches != pixel_values.shape[0]:
            raise ValueError(f"grid_thw covers {patches} patches, got {pixel_values.shape[0]}")
        return self.visual(pixel_values.to(self.device, self.dtype), grid)

    def encode_frames(self, frames: FrameBatch) -> Tensor:
        """uint8 frames (any device) -> encode_vision's output; the frames move to the model's device as uint8 and
        are patchified, normalised and embedded there in one step (the fused Triton kernel on CUDA)."""
        return self.visual(frames.to(self.device, non_blocking=True), frames.grids)

    def split_vision(self, vision: Tensor) -> tuple[Tensor, Tensor | None]:
        """encode_vision rows [K, (1 + L) * D] -> (embeddings [K, D], DeepStack features [L, K, D] or None)."""
        if self.deepstack_layers == 0:
            return vision, None
        d = self.config.text.hidden_size
        return vision[:, :d], vision[:, d:].reshape(vision.shape[0], self.deepstack_layers, d).transpose(0, 1)

    def embed_media(self, embeds: Tensor, rows: Tensor, vision: Tensor) -> tuple[Tensor, DeepStack | None]:
        """Write vision rows [K, (1 + L) * D] over embeds [N, D] at rows [K]; the DeepStack input (or None)."""
        main, deep = self.split_vision(vision)
        embeds = embeds.clone()
        embeds[rows] = main.to(embeds.dtype)
        return embeds, None if deep is None else DeepStack(rows, deep)

    def forward_hidden(self, inputs_embeds: Tensor, positions: Tensor, ctx: AttentionContext,
                       deepstack: DeepStack | None = None) -> Tensor:
        """inputs_embeds [N, D], positions [3, N] -> final-normed hidden states [N, D]."""
        return self.language(inputs_embeds, positions.to(inputs_embeds.device), ctx, deepstack)

    def compute_logits(self, hidden: Tensor) -> Tensor:
        """hidden [N, D] -> float32 logits [N, V] (tied head reuses the embedding matrix)."""
        weight = self.language.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        if self.vocab_parallel is not None:
            return self.vocab_parallel(hidden, weight)
        return linear(hidden, weight).float()

    def forward(
        self,
        input_ids: Tensor,
        positions: Tensor,
        pixel_values: Tensor | None = None,
        image_grid_thw: Tensor | None = None,
        pixel_values_videos: Tensor | None = None,
        video_grid_thw: Tensor | None = None,
        ctx: AttentionContext | None = None,
    ) -> Tensor:
        """Full forward on flat input_ids [N] -> float32 logits [N, V]; ctx defaults to one causal sequence."""
        input_ids = input_ids.to(self.device)
        embeds = self.embed_tokens(input_ids)  # [N, D]
        media = (
            (pixel_values, image_grid_thw, self.config.image_token_id, "image"),
            (pixel_values_videos, video_grid_thw, self.config.video_token_id, "video"),
        )
        rows, deep = [], []
        for pixels, grid, token_id, what in media:
            if pixels is not None:
                if grid is None:
                    raise ValueError(f"{what} pixel values given without a grid_thw")
                mask = input_ids == token_id
                main, features = self.split_vision(self.encode_vision(pixels, grid))
                embeds = scatter_embeddings(embeds, mask, main, what)
                if features is not None:
                    rows.append(mask.nonzero()[:, 0])
                    deep.append(features)  # [L, K, D]
        deepstack = DeepStack(torch.cat(rows), torch.cat(deep, dim=1)) if deep else None
        ctx = ctx if ctx is not None else DenseAttentionContext([input_ids.shape[0]])
        if self.has_recurrent_state and getattr(ctx, "recurrent", None) is None:  # one sequence from a zero state
            from mm_infer.models.recurrent_batch import fresh_batch

            ctx.recurrent = fresh_batch(self.state_pool(1), [input_ids.shape[0]])  # type: ignore[attr-defined]
        return self.compute_logits(self.forward_hidden(embeds, positions, ctx, deepstack))
