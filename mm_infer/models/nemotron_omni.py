"""Nemotron 3 Nano Omni (HF `nemotron_h_omni`): RADIO vision + projector into the hybrid Mamba-2 / attention / MoE
LM, behind the same calls the engine makes on QwenVLModel, plus the recurrent-state pool the Mamba layers need."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from mm_infer.models.attention import AttentionContext, DenseAttentionContext
from mm_infer.models.config import ModelConfig
from mm_infer.models.nemotron_h import NemotronHModel
from mm_infer.models.nemotron_moe import NemotronRouter
from mm_infer.models.nemotron_omni_names import omni_target
from mm_infer.models.parakeet import OmniAudio
from mm_infer.models.qwen_vl import scatter_embeddings
from mm_infer.models.radio import OmniVision
from mm_infer.models.recurrent_batch import RecurrentBatch, StatePool, fresh_batch
from mm_infer.models.routing_capture import RoutingCapture


class NemotronOmniModel(nn.Module):
    """Flat, unpadded batches in; KV behind the AttentionContext, Mamba state behind its `recurrent` batch."""

    has_recurrent_state = True
    tensor_target = staticmethod(omni_target)  # the loader's stored-name mapping for this family

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        assert config.omni is not None, "NemotronOmniModel needs a nemotron_h_omni config"
        omni = config.omni
        self.config = config
        self.language = NemotronHModel(omni.lm)
        self.vision = OmniVision(omni.radio, omni.projector_hidden, omni.lm.hidden, omni.final_norm)
        self.audio = OmniAudio(omni.audio, omni.lm.hidden) if omni.audio is not None else None

    @property
    def dtype(self) -> torch.dtype:
        return self.language.embeddings.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.language.embeddings.weight.device

    def float32_parameters(self) -> list[str]:
        """Modules kept in float32 whatever the model dtype: the MoE routers (gate.weight, e_score_correction_bias),
        as transformers' _keep_in_fp32_modules_strict keeps them."""
        return [name for name, m in self.named_modules() if isinstance(m, NemotronRouter)]

    @property
    def scan_chunk(self) -> int:
        """The Mamba scan's chunk over a prompt (the scheduler keeps chunked prefill on its grid)."""
        return self.language.cfg.mamba.chunk

    def state_pool(self, slots: int) -> StatePool:
        return self.language.state_pool(slots)

    def state_bytes_per_slot(self) -> int:
        return StatePool.bytes_per_slot(self.language.state_shapes(), self.dtype)

    def capture_routing(self, rows: int) -> RoutingCapture | None:
        return None  # routing replay (R3) is refused for this family at start-up

    def embed_tokens(self, input_ids: Tensor) -> Tensor:
        """input_ids [N] -> [N, D]."""
        return self.language.embeddings(input_ids)

    def encode_vision(self, pixel_values: Tensor, grid_thw: Tensor | list) -> Tensor:
        """Items' rows back to back -> [sum t*h*w / 4, D]. An image is (1, gh, gw) with patch-wide rows; a video
        (tubelets, gh, gw) with tubelet-wide rows (2 frames x patch)."""
        grid = grid_thw.reshape(-1, 3).tolist() if isinstance(grid_thw, Tensor) else [list(g) for g in grid_thw]
        rows = [t * h * w for t, h, w in grid]
        if sum(rows) != pixel_values.shape[0]:
            raise ValueError(f"grid_thw covers {sum(rows)} patches, got {pixel_values.shape[0]}")
        x = pixel_values.to(self.device, self.dtype)
        if x.shape[1] == self.vision.tower.patch_projection.in_features:
            return self.vision(x, [(h, w) for _, h, w in grid])
        return torch.cat([self.vision.video_rows(part, t, h, w) for part, (t, h, w) in zip(x.split(rows), grid,
                                                                                              strict=True)])

    def encode_items(self, items: list) -> Tensor:
        """MediaItems (rows form) -> their embeddings back to back: images together, each video and each audio clip
        (mel features [F, mel], F - 1 valid frames, as HF's extractor makes them) on its own."""
        out: list[Tensor] = []
        images = [it for it in items if it.modality == "image"]
        by_hash = {}
        if images:
            feats = self.encode_vision(torch.cat([it.pixel_values for it in images]), [it.grid_thw for it in images])
            by_hash = dict(zip([it.content_hash for it in images],
                               feats.split([it.num_patches // 4 for it in images]), strict=True))
        for it in items:
            if it.modality == "audio":
                out.append(self.encode_audio(it.pixel_values))
            else:
                out.append(by_hash[it.content_hash] if it.modality == "image" else
                           self.encode_vision(it.pixel_values, [it.grid_thw]))
        return torch.cat(out)

    def encode_audio(self, features: Tensor) -> Tensor:
        """One clip's mel features [F, mel] (F - 1 valid frames) -> [n_tokens, D]; a 400-worthy error without a
        tower is raised before this (the prompt refuses audio then)."""
        if self.audio is None:
            raise ValueError("this checkpoint has no audio tower (no audio_config)")
        return self.audio(features.to(self.device, self.dtype), features.shape[0] - 1)

    def embed_media(self, embeds: Tensor, rows: Tensor, vision: Tensor) -> tuple[Tensor, None]:
        """Write vision rows [K, D] over embeds [N, D] at rows [K]."""
        embeds = embeds.clone()
        embeds[rows] = vision.to(embeds.dtype)
        return embeds, None

    def forward_hidden(self, inputs_embeds: Tensor, positions: Tensor, ctx: AttentionContext,
                       deepstack: None = None) -> Tensor:
        """inputs_embeds [N, D] -> final-normed hidden [N, D]; positions are unused (this LM has no RoPE) and the
        Mamba state comes from ctx.recurrent, a RecurrentBatch."""
        states: RecurrentBatch = ctx.recurrent  # type: ignore[attr-defined]
        return self.language.forward_hidden(inputs_embeds, ctx, states)

    def compute_logits(self, hidden: Tensor) -> Tensor:
        """hidden [N, D] -> float32 logits [N, V]."""
        return self.language.compute_logits(hidden)

    def forward(self, input_ids: Tensor, pixel_values: Tensor | None = None, image_grid_hw: Tensor | None = None,
                pixel_values_videos: Tensor | None = None) -> Tensor:
        """One whole prompt from scratch as HF's forward takes it (tests): input_ids [N], image patches
        [P, 768] with grids [M, 2], videos [V, tubelets, T*C, H, W] -> float32 logits [N, V]."""
        input_ids = input_ids.to(self.device)
        embeds = self.embed_tokens(input_ids)
        mask = input_ids == self.config.image_token_id  # images, then videos, fill the <image> tokens in order
        feats = []
        if pixel_values is not None:
            assert image_grid_hw is not None, "image pixel values given without image_grid_hw"
            grid = [(1, h, w) for h, w in image_grid_hw.tolist()]
            feats.append(self.encode_vision(pixel_values, grid))
        for video in pixel_values_videos if pixel_values_videos is not None else []:
            feats.append(self.vision.video(video.to(self.device, self.dtype)))
        if feats:
            embeds = scatter_embeddings(embeds, mask, torch.cat(feats), "media")
        n = input_ids.shape[0]
        ctx = DenseAttentionContext([n])
        ctx.recurrent = fresh_batch(self.state_pool(1), [n])  # type: ignore[attr-defined]
        return self.compute_logits(self.forward_hidden(embeds, torch.empty(0), ctx))
