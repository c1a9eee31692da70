"""Nemotron Omni images against HF 5.24's processor goldens (scripts/golden/make_nemotron_omni_goldens.py)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from mm_infer.config import MediaConfig
from mm_infer.media import MediaInvalidError, preprocess_images
from mm_infer.media.omni_image import OmniImageSpec, omni_image_rows, omni_patch_grid
from mm_infer.prompt.media import media_defaults

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "assets" / "models" / "tiny-nemotron-omni"
GOLDEN_DIR = REPO / "tests" / "golden" / "nemotron_omni"
GOLDEN = json.loads((GOLDEN_DIR / "golden.json").read_text())
ARRAYS = dict(np.load(GOLDEN_DIR / "arrays.npz"))
SPEC = OmniImageSpec.from_config(json.loads((MODEL / "preprocessor_config.json").read_text()))


def sha(rows: torch.Tensor) -> str:
    return hashlib.sha256(rows.contiguous().numpy().astype("<f4").tobytes()).hexdigest()


def check_rows(rows: torch.Tensor, key: str, want_sha: str) -> None:
    """Bit-exact: the whole array where stored (torch.equal, else the first rows), and the digest always."""
    if key in ARRAYS:
        assert torch.equal(rows, torch.from_numpy(ARRAYS[key])), (rows - torch.from_numpy(ARRAYS[key])).abs().max()
    else:
        head = torch.from_numpy(ARRAYS[f"head/{key}"])
        assert torch.equal(rows[:len(head)], head), (rows[:len(head)] - head).abs().max()
    assert sha(rows) == want_sha


@pytest.mark.parametrize("name", sorted(GOLDEN["images"]))
def test_image_matches_hf(name: str) -> None:
    # catches: half-up instead of banker's round (square_64, photo_q90_512), unfused normalisation (~5e-7 off),
    # antialias off or a uint8 resize (photo_600x400 downscales), a resize when the size already fits (square_64),
    # the wrong patch layout (channel-major rows)
    case = GOLDEN["images"][name]
    packed = preprocess_images([REPO / case["path"]], omni=SPEC)
    assert packed.imgs_sizes.tolist() == [[1, *case["grid"]]]
    assert packed.pixel_values.shape == tuple(case["shape"])
    check_rows(packed.pixel_values, f"image/{name}", case["sha256"])


def test_media_defaults_detect_omni_and_feed_the_server_processor() -> None:
    # catches: the Omni family not detected from image_processor_type (the Qwen smart_resize path would run)
    from mm_infer.media import MediaProcessor

    d = media_defaults(MODEL, MediaConfig())
    assert d.omni_image == SPEC and d.omni_video is not None and d.video_family == "omni"
    image_opts, video_opts = d.processor_options()
    case = GOLDEN["images"]["photo_600x400"]
    with MediaProcessor(image_options=image_opts, video_options=video_opts, max_workers=1) as proc:
        packed = proc.process_images([(REPO / case["path"]).read_bytes()])
    check_rows(packed.pixel_values, "image/photo_600x400", case["sha256"])


def test_bankers_round_in_the_grid() -> None:
    # catches: math.floor(x + 0.5) for round: a 64x64 image would get 5x5 -> 6x6 patches instead of 4x4
    assert omni_patch_grid(64, 64, SPEC, SPEC.budget(1)) == (4, 4)
    assert omni_patch_grid(512, 512, SPEC, SPEC.budget(1)) == (16, 16)  # 32.5 -> 32, then 0.5 * 32
    d = OmniImageSpec()  # HF's defaults: the examples of the spec (docs/dev/nemotron-omni-hf-reading.md 5.1)
    got = [omni_patch_grid(h, w, d, d.budget(1)) for h, w in [(300, 500), (48, 48), (1000, 1000), (4000, 3000)]]
    assert got == [(26, 42), (32, 32), (64, 64), (132, 100)]


def test_budget_counts_images_only_without_a_cap() -> None:
    # catches: ignoring n_images (HF: max((max_model_len - 4) * merge², min_num_patches * n)) or the cap
    spec = OmniImageSpec(min_num_patches=1024, max_num_patches=0, max_model_len=100)
    assert spec.budget(1) == 1024 and spec.budget(3) == 3072
    assert SPEC.budget(50) == 256  # capped by max_num_patches


def test_fused_normalisation_is_what_hf_runs() -> None:
    # catches: (x/255 - mean)/std instead of the fused (x - 255 mean)/(255 std): the values differ in the last bits
    image = torch.arange(64 * 64 * 3, dtype=torch.int64).remainder(256).to(torch.uint8).reshape(3, 64, 64)
    rows, grid = omni_image_rows(image, SPEC)
    mean, std = torch.tensor(SPEC.image_mean).view(3, 1, 1), torch.tensor(SPEC.image_std).view(3, 1, 1)
    unfused = (image.float() / 255.0 - mean) / std
    assert grid == (1, 4, 4)
    assert not torch.equal(rows[0].reshape(3, 16, 16), unfused[:, :16, :16])
    assert torch.allclose(rows[0].reshape(3, 16, 16), unfused[:, :16, :16], atol=1e-5)


def test_legacy_norm_names_and_defaults() -> None:
    # catches: the released configs' norm_mean / norm_std ignored (HF maps them to image_mean / image_std)
    spec = OmniImageSpec.from_config({"norm_mean": [0.5, 0.5, 0.5], "norm_std": [0.25, 0.25, 0.25],
                                      "downsample_ratio": 0.5})
    assert spec.image_mean == (0.5, 0.5, 0.5) and spec.image_std == (0.25, 0.25, 0.25) and spec.merge_size == 2
    assert OmniImageSpec.from_config({}) == OmniImageSpec()


@pytest.mark.parametrize("size", [(0, 10), (10, 0)])
def test_empty_image_is_refused(size: tuple[int, int]) -> None:
    # catches: a ZeroDivisionError (500) instead of a 400 for a degenerate size
    with pytest.raises(MediaInvalidError):
        omni_patch_grid(*size, SPEC, SPEC.budget(1))


def test_too_thin_image_is_refused() -> None:
    # catches: HF's ZeroDivisionError when the budget floors one side to 0 (a 4 x 100000 strip at 16 patches)
    spec = OmniImageSpec(min_num_patches=4, max_num_patches=16, max_model_len=8)
    with pytest.raises(MediaInvalidError, match="too thin"):
        omni_patch_grid(4, 100_000, spec, spec.budget(1))
