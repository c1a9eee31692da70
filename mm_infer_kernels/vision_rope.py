"""2D (h, w) rotary embedding of the Qwen2-VL vision tower on q and k (launcher + torch reference)."""

from __future__ import annotations

import torch

from mm_infer_kernels import _triton
from mm_infer_kernels._items import sizes_list

QK_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def vision_position_ids(grid_thw: torch.Tensor | list, merge_size: int = 2) -> torch.Tensor:
    """[S, 2] int64 (h, w) patch coordinates in merge order, repeated t times per item (as HF)."""
    ids = []
    for t, h, w in sizes_list(grid_thw, 3, "grid_thw"):
        assert h % merge_size == 0 and w % merge_size == 0, f"grid {h}x{w} vs merge {merge_size}"
        hpos = torch.arange(h).unsqueeze(1).expand(h, w)  # [h, w]
        wpos = torch.arange(w).unsqueeze(0).expand(h, w)  # [h, w]
        blocks = (h // merge_size, merge_size, w // merge_size, merge_size)
        hw = torch.stack([hpos.reshape(blocks).permute(0, 2, 1, 3).flatten(),
                          wpos.reshape(blocks).permute(0, 2, 1, 3).flatten()], dim=-1)  # [h*w, 2]
        ids.append(hw.repeat(t, 1))  # [t*h*w, 2]
    return torch.cat(ids, dim=0)  # [S, 2]


def rope_inv_freq(theta: float, dim: int) -> torch.Tensor:
    """[dim/2] float32 inverse frequencies, computed on the CPU exactly as HF does (then moved by the caller)."""
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float, device="cpu") / dim))


def vision_rope_cos_sin(grid_thw: torch.Tensor | list, head_dim: int, *, theta: float = 10000.0,
                        merge_size: int = 2, device: torch.device | str | None = None,
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) [S, head_dim] float32 for the vision tower: emb = cat(h*inv_freq, w*inv_freq) twice."""
    assert head_dim % 4 == 0, f"head_dim must be a multiple of 4, got {head_dim}"
    inv_freq = rope_inv_freq(theta, head_dim // 2).to(device)  # [head_dim/4]
    pos = vision_position_ids(grid_thw, merge_size).to(device)  # [S, 2]
    freqs = (pos[..., None].float() * inv_freq).flatten(1)  # [S, dim] = cat(h*inv_freq, w*inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)  # [S, head_dim]
    return emb.cos(), emb.sin()


def vision_rope_reference(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                          sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """HF apply_rotary_pos_emb_vision: q, k [S, H, Dh], cos, sin [S, Dh]; fp32 math, input dtype out."""
    cos, sin = cos.unsqueeze(-2).float(), sin.unsqueeze(-2).float()  # [S, 1, Dh]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        half = xf.shape[-1] // 2
        rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)  # rotate_half
        return ((xf * cos) + (rotated * sin)).to(x.dtype)

    return rotate(q), rotate(k)


def vision_rope_torch(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                      sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference's arithmetic with two fewer temporaries (the CPU path): x*cos, then the rotated half's
    products subtracted and added in place. Bit-equal: (-x)*s == -(x*s) and a + (-b) == a - b in IEEE floats."""
    cos, sin = cos.unsqueeze(-2).float(), sin.unsqueeze(-2).float()  # [S, 1, Dh]
    half = q.shape[-1] // 2

    def rotate(x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        out = xf * cos  # [S, H, Dh]
        out[..., :half] -= xf[..., half:] * sin[..., :half]
        out[..., half:] += xf[..., :half] * sin[..., half:]
        return out.to(x.dtype)

    return rotate(q), rotate(k)


def check_rope_args(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Assert q, k [S, H, Dh] (same shape, dtype, device; unit last stride) and cos, sin [S, Dh] fp32."""
    assert q.ndim == 3 and q.shape == k.shape, f"q, k must be [S, H, Dh] alike: {q.shape}, {k.shape}"
    assert q.dtype == k.dtype and q.dtype in QK_DTYPES, f"q, k dtype {q.dtype}, {k.dtype}"
    assert q.shape[2] % 2 == 0, f"head_dim must be even, got {q.shape[2]}"
    assert q.stride(2) == 1 and k.stride(2) == 1, "q, k must have a unit stride on head_dim"
    for name, t in (("cos", cos), ("sin", sin)):
        assert t.shape == (q.shape[0], q.shape[2]), f"{name} must be [S, Dh], got {list(t.shape)}"
        assert t.dtype == torch.float32 and t.stride(1) == 1, f"{name} must be float32 with unit last stride"
        assert t.device == q.device, f"{name} on {t.device}, q on {q.device}"
    assert k.device == q.device, f"k on {k.device}, q on {q.device}"


def vision_rope_triton(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                       sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton 2D rope: new contiguous (q_out, k_out) [S, H, Dh], bit-equal to the reference (no FMA)."""
    check_rope_args(q, k, cos, sin)
    s, h, dh = q.shape
    q_out = torch.empty(s, h, dh, dtype=q.dtype, device=q.device)  # [S, H, Dh]
    k_out = torch.empty_like(q_out)  # [S, H, Dh]
    if q.numel() == 0:
        return q_out, k_out
    jit = _triton.load("_rope_triton", q, k, cos, sin)
    half = dh // 2
    block_d = _triton.next_power_of_2(half)
    block_p = max(1, (8192 if _triton.interpreting() else 2048) // block_d)
    grid = (_triton.cdiv(s * h, block_p),)
    jit.vision_rope_kernel[grid](q, k, cos, sin, q_out, k_out, s * h, h, q.stride(0), q.stride(1),
                                 k.stride(0), k.stride(1), cos.stride(0), sin.stride(0),
                                 HALF=half, BLOCK_P=block_p, BLOCK_D=block_d,
                                 OUT_BF16=q.dtype == torch.bfloat16, num_warps=4, enable_fp_fusion=False)
    return q_out, k_out
