"""Goldens for Qwen3.5's processors (HF transformers 5.24's AutoProcessor: Qwen3VLProcessor, Qwen2VLImageProcessor,
Qwen3VLVideoProcessor) on one real image and one real video of tiny-qwen3.5.

Run from the repo root with the main venv:
    HF_HUB_OFFLINE=1 .venv/bin/python scripts/golden/make_qwen35_goldens.py
It decodes the video with our decoder (PyAV, main venv), then runs itself under the vLLM peer venv
(.peers/vllm-venv: torchvision, which HF's default image and video processors need) with the main venv's
transformers 5.24 first on PYTHONPATH, and writes tests/golden/qwen35/{golden.json,arrays.npz}: the processor
classes, expanded ids, mm_token_type_ids, grids, M-RoPE positions (HF's get_rope_index), and pixel values as a
sha256 of their float32 bytes plus the first rows (the whole arrays are megabytes).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "assets" / "models" / "tiny-qwen3.5"
OUT = REPO / "tests" / "golden" / "qwen35"
IMAGE = "assets/media/images/photo.png"  # 600x400: resized to the 22 x 34 patch grid
VIDEO = "assets/media/videos/odd7_h264_2fps.mp4"  # 7 frames at 2 fps: sampled to 8 (the last repeated)
PEER_PYTHON = REPO / ".peers" / "vllm-venv" / "bin" / "python"
MAIN_TRANSFORMERS = REPO / ".venv" / "lib" / "python3.11" / "site-packages" / "transformers"
HEAD_ROWS = 4
MESSAGES = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "and"}, {"type": "video"},
                                         {"type": "text", "text": "What moves?"}]}]


def digest(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a, dtype="<f4").tobytes()).hexdigest()


def decoded_video() -> tuple[np.ndarray, dict]:
    """Every frame of VIDEO (our PyAV decoder) and the metadata HF samples from (main venv)."""
    from mm_infer.media.sources import read_encoded
    from mm_infer.media.video import decode_frames, probe

    enc = read_encoded(REPO / VIDEO)
    info = probe(enc)
    return decode_frames(enc, list(range(info.total_frames)), "pyav"), {"fps": info.fps,
                                                                        "total_num_frames": info.total_frames}


def main() -> None:
    frames, meta = decoded_video()
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "transformers").symlink_to(MAIN_TRANSFORMERS)
        np.save(Path(tmp) / "frames.npy", frames)
        (Path(tmp) / "meta.json").write_text(json.dumps(meta))
        env = {**os.environ, "PYTHONPATH": tmp, "HF_HUB_OFFLINE": "1"}
        subprocess.run([str(PEER_PYTHON), __file__, "--hf", tmp], check=True, env=env, cwd=REPO)
        golden = json.loads((Path(tmp) / "hf.json").read_text())
        arrays = dict(np.load(Path(tmp) / "hf.npz"))
    OUT.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT / "arrays.npz", **arrays)
    (OUT / "golden.json").write_text(json.dumps(golden, indent=1) + "\n")
    size = sum(p.stat().st_size for p in OUT.iterdir())
    print(f"wrote {OUT} ({size / 1024:.0f} KiB)")


# ---- the HF side (runs in the peer venv) ----------------------------------------------------------------------


def hf_rope(out) -> tuple[np.ndarray, int]:
    """HF's own M-RoPE positions [3, L] and delta for the processor's outputs (Qwen3_5Model.get_rope_index)."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5Model

    class _Cfg:  # get_rope_index reads only the merge size
        vision_config = type("V", (), {"spatial_merge_size": 2})

    holder = type("M", (), {"config": _Cfg, "get_vision_position_ids": Qwen3_5Model.get_vision_position_ids})()
    pos, delta = Qwen3_5Model.get_rope_index(holder, out["input_ids"], out["mm_token_type_ids"],
                                             out["image_grid_thw"], out["video_grid_thw"].clone())
    return pos[:, 0].numpy(), int(delta[0, 0])


def hf_main(tmp: Path) -> None:
    import transformers
    from PIL import Image
    from transformers import AutoProcessor

    proc = AutoProcessor.from_pretrained(MODEL)
    frames = np.load(tmp / "frames.npy")
    meta = json.loads((tmp / "meta.json").read_text())
    text = proc.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    out = proc(text=[text], images=[Image.open(REPO / IMAGE)], videos=[frames], video_metadata=[meta],
               return_tensors="pt")
    pos, delta = hf_rope(out)
    pv, pvv = out["pixel_values"].numpy(), out["pixel_values_videos"].numpy()
    golden = {"transformers": transformers.__version__, "image": IMAGE, "video": VIDEO, "messages": MESSAGES,
              "classes": {"processor": type(proc).__name__, "image_processor": type(proc.image_processor).__name__,
                          "video_processor": type(proc.video_processor).__name__},
              "rendered": text, "input_ids": out["input_ids"][0].tolist(),
              "mm_token_type_ids": out["mm_token_type_ids"][0].tolist(),
              "image_grid_thw": out["image_grid_thw"].tolist(), "video_grid_thw": out["video_grid_thw"].tolist(),
              "pixel_values": {"shape": list(pv.shape), "sha256": digest(pv)},
              "pixel_values_videos": {"shape": list(pvv.shape), "sha256": digest(pvv)}, "mrope_delta": delta}
    (tmp / "hf.json").write_text(json.dumps(golden))
    np.savez(tmp / "hf.npz", mrope_positions=pos, pixel_values_head=pv[:HEAD_ROWS],
             pixel_values_videos_head=pvv[:HEAD_ROWS])


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--hf":
        hf_main(Path(sys.argv[2]))
    else:
        main()
