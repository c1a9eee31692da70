"""Goldens for Nemotron Omni media preprocessing and prompt expansion, made by HF transformers 5.24's own processors.

Run from the repo root with the main venv:
    HF_HUB_OFFLINE=1 .venv/bin/python scripts/golden/make_nemotron_omni_goldens.py
It decodes the test videos with our decoder (PyAV, main venv), then runs itself under the vLLM peer venv
(.peers/vllm-venv: torchvision, which HF's image processor needs) with the main venv's transformers 5.24 first on
PYTHONPATH, and writes tests/golden/nemotron_omni/{golden.json,arrays.npz}. Pixel values are stored whole when
small, and always as a sha256 of their float32 bytes in our row layout (images [gh*gw, 3*16*16]; videos
[n_tub*gh*gw, 2*3*16*16], each row (t*C + c, py, px) of one tubelet patch).
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
MODEL = REPO / "assets" / "models" / "tiny-nemotron-omni"
OUT = REPO / "tests" / "golden" / "nemotron_omni"
IMAGES = "assets/media/images"
VIDEOS = "assets/media/videos"
PEER_PYTHON = REPO / ".peers" / "vllm-venv" / "bin" / "python"
MAIN_TRANSFORMERS = REPO / ".venv" / "lib" / "python3.11" / "site-packages" / "transformers"
FULL_BYTES = 240_000  # pixel arrays up to this size are stored whole (the rest: sha256 + the first rows)
HEAD_ROWS = 8

# name -> path (repo-relative; "synthetic:square64" is made here)
IMAGE_CASES = {
    "tiny_9x13": f"{IMAGES}/tiny_9x13.png",  # 1 patch -> scaled up to the min budget (4, 4)
    "square_64": f"{OUT.relative_to(REPO)}/square_64.png",  # 64/16 + .5 = 4.5 -> 4 (banker's), exact size: no resize
    "half_round_42x126": f"{IMAGES}/half_round_42x126.png",  # odd width 3 -> 4
    "strip_wide_600x24": f"{IMAGES}/strip_wide.png",  # 2 x 38, thin
    "photo_600x400": f"{IMAGES}/photo.png",  # hits the max budget: 26 x 38 -> 12 x 20
    "photo_q90_512": f"{IMAGES}/photo_q90.jpg",  # JPEG; 32.5 -> 32 (banker's) -> 16 x 16 = the max budget
}
# name -> (source, request kwargs); "frames5" is 5 synthetic frames given as arrays (no fps: "Frame k" labels)
VIDEO_CASES = {
    "odd7_all": (f"{VIDEOS}/odd7_h264_2fps.mp4", {}),  # 7 frames -> 4 tubelets, the last padded
    "pan24_fps2": (f"{VIDEOS}/pan_h264_24fps.mp4", {"fps": 2.0}),  # [0,12,24,36]; int(1000/24) = 41 ms steps
    "pan30_n3": (f"{VIDEOS}/pan_h264_30fps.mp4", {"num_frames": 3}),  # [0,33,66]: 2 tubelets, the last padded
    "frames5": ("synthetic:frames5", {}),
}
# name -> (messages, images, video case or None)
PROMPT_CASES = {
    "image": ([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe it."}]}],
              ["photo_600x400"], None),
    "video": ([{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What happens?"}]}],
              [], "odd7_all"),
    "video_then_image": ([{"role": "user", "content": [
        {"type": "text", "text": "Look: "}, {"type": "video"}, {"type": "text", "text": " and "}, {"type": "image"},
        {"type": "text", "text": "?"}]}], ["tiny_9x13"], "pan24_fps2"),
    "two_images": ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": [
        {"type": "image"}, {"type": "image"}, {"type": "text", "text": "Which is larger?"}]}],
        ["tiny_9x13", "half_round_42x126"], None),
    "same_size_images": ([{"role": "user", "content": [{"type": "image"}, {"type": "image"}]}],
                         ["square_64", "square_64"], None),
    "frames_no_fps": ([{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "Go."}]}],
                      [], "frames5"),
}


def digest(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a, dtype="<f4").tobytes()).hexdigest()


def synthetic_frames() -> np.ndarray:
    """5 frames of 50x70, seeded noise: uint8 [5, 50, 70, 3]."""
    return np.random.default_rng(7).integers(0, 256, (5, 50, 70, 3), dtype=np.uint8)


def write_square_png() -> None:
    """A 64x64 PNG (smooth gradients plus noise), the banker's-round / no-resize case."""
    from PIL import Image

    y, x = np.mgrid[0:64, 0:64]
    noise = np.random.default_rng(3).integers(0, 40, (64, 64, 3))
    rgb = np.stack([x * 4, y * 4, (x + y) * 2], axis=-1) + noise
    OUT.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8)).save(OUT / "square_64.png")


def decoded_videos() -> dict[str, dict]:
    """Every frame of each test video, decoded by our decoder, with the container's fps (main venv)."""
    from mm_infer.media.sources import read_encoded
    from mm_infer.media.video import decode_frames, probe

    out = {}
    for name, (src, _) in VIDEO_CASES.items():
        if src.startswith("synthetic:"):
            out[name] = {"frames": synthetic_frames(), "fps": None}
            continue
        enc = read_encoded(REPO / src)
        info = probe(enc)
        out[name] = {"frames": decode_frames(enc, list(range(info.total_frames)), "pyav"), "fps": info.fps}
    return out


def main() -> None:
    write_square_png()
    videos = decoded_videos()
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "transformers").symlink_to(MAIN_TRANSFORMERS)
        np.savez(Path(tmp) / "frames.npz", **{k: v["frames"] for k, v in videos.items()})
        (Path(tmp) / "fps.json").write_text(json.dumps({k: v["fps"] for k, v in videos.items()}))
        env = {**os.environ, "PYTHONPATH": tmp, "HF_HUB_OFFLINE": "1"}
        subprocess.run([str(PEER_PYTHON), __file__, "--hf", tmp], check=True, env=env, cwd=REPO)
        golden = json.loads((Path(tmp) / "hf.json").read_text())
        arrays = dict(np.load(Path(tmp) / "hf.npz"))
    keep = {k: v for k, v in arrays.items() if v.nbytes <= FULL_BYTES}
    keep.update({f"head/{k}": v[:HEAD_ROWS] for k, v in arrays.items() if k not in keep})
    np.savez_compressed(OUT / "arrays.npz", **keep)
    (OUT / "golden.json").write_text(json.dumps(golden, indent=1) + "\n")
    size = sum(p.stat().st_size for p in OUT.iterdir())
    whole = sum(not k.startswith("head/") for k in keep)
    print(f"wrote {OUT} ({whole} of {len(arrays)} arrays whole, {size / 2**20:.2f} MiB)")


# ---- the HF side (runs in the peer venv) ----------------------------------------------------------------------


def hf_processor():
    from transformers import AutoTokenizer, ParakeetFeatureExtractor
    from transformers.models.nemotron_h_omni import image_processing_nemotron_h_omni as ip
    from transformers.models.nemotron_h_omni import processing_nemotron_h_omni as pp
    from transformers.models.nemotron_h_omni import video_processing_nemotron_h_omni as vp

    # the processor insists on an audio feature extractor; the tiny checkpoint has none, and no audio is sent
    return pp.NemotronH_Omni_Reasoning_V3Processor(
        image_processor=ip.NemotronH_Omni_Reasoning_V3ImageProcessor.from_pretrained(MODEL),
        video_processor=vp.NemotronH_Omni_Reasoning_V3VideoProcessor.from_pretrained(MODEL),
        tokenizer=AutoTokenizer.from_pretrained(MODEL), feature_extractor=ParakeetFeatureExtractor())


def video_rows(pv) -> np.ndarray:
    """HF's pixel_values_videos [1, n, T*C, H, W] -> our rows [n*gh*gw, T*C*16*16], each (t*C + c, py, px)."""
    _, n, tc, h, w = pv.shape
    x = pv[0].reshape(n, tc, h // 16, 16, w // 16, 16).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(n * (h // 16) * (w // 16), tc * 256).numpy()


def hf_call(proc, text: str, images: list[str], video: str | None, frames, fps: dict) -> dict:
    """The processor's outputs for one call; a video goes as its decoded frames with the container's metadata."""
    from PIL import Image
    from transformers.video_utils import VideoMetadata

    kw: dict = {}
    if images:
        kw["images"] = [Image.open(REPO / IMAGE_CASES[i]) for i in images]
    if video is not None:
        arr, opts = frames[video], VIDEO_CASES[video][1]
        kw["videos"] = [arr]
        if fps[video] is not None:
            sampled = bool(opts)
            kw["video_metadata"] = [VideoMetadata(total_num_frames=len(arr), fps=fps[video],
                                                  frames_indices=None if sampled else list(range(len(arr))))]
            kw.update(do_sample_frames=sampled, **opts)
    return proc(text=text, **kw)


def hf_main(tmp: Path) -> None:
    proc = hf_processor()
    frames = dict(np.load(tmp / "frames.npz"))
    fps = json.loads((tmp / "fps.json").read_text())
    golden: dict = {"transformers": __import__("transformers").__version__, "images": {}, "videos": {},
                    "prompts": {}}
    arrays: dict[str, np.ndarray] = {}
    for name in IMAGE_CASES:
        out = hf_call(proc, "<image>", [name], None, frames, fps)
        pv = out["pixel_values"].numpy()
        arrays[f"image/{name}"] = pv
        golden["images"][name] = {"path": IMAGE_CASES[name], "grid": out["image_grid_hw"][0].tolist(),
                                  "sha256": digest(pv), "shape": list(pv.shape)}
    for name, (src, opts) in VIDEO_CASES.items():
        out = hf_call(proc, "<video>", [], name, frames, fps)
        rows, pvv = video_rows(out["pixel_values_videos"]), out["pixel_values_videos"]
        arrays[f"video/{name}"] = rows
        if src.startswith("synthetic:"):
            arrays[f"frames/{name}"] = frames[name]
        golden["videos"][name] = {"source": src, "kwargs": opts, "grid": [pvv.shape[1], pvv.shape[3] // 16,
                                  pvv.shape[4] // 16], "sha256": digest(rows), "shape": list(rows.shape),
                                  "text": proc.tokenizer.decode(out["input_ids"][0])}
    for name, (messages, images, video) in PROMPT_CASES.items():
        text = proc.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        out = hf_call(proc, text, images, video, frames, fps)
        golden["prompts"][name] = {"messages": messages, "images": images, "video": video, "rendered": text,
                                   "input_ids": out["input_ids"][0],
                                   "expanded": proc.tokenizer.decode(out["input_ids"][0])}
        if "pixel_values" in out:
            golden["prompts"][name]["image_sha256"] = digest(out["pixel_values"].numpy())
    (tmp / "hf.json").write_text(json.dumps(golden))
    np.savez(tmp / "hf.npz", **arrays)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--hf":
        hf_main(Path(sys.argv[2]))
    else:
        main()
