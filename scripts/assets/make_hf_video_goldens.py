"""HF-rule video goldens: HF's own Qwen2-VL video processor picks the frames (do_sample_frames=True) for every video.

Run from the project's venv: it decodes with PyAV here, then runs HF's processor in the vLLM peer's venv, where
torchvision imports (the project's venv has none):  python scripts/assets/make_hf_video_goldens.py
Writes assets/golden/qwen2vl-hf-sampling/INDEX.json: per video, the frame indices HF sampled, the grid, the sha256 of
`pixel_values_videos` (float32 bytes) and Qwen2.5-VL's `second_per_grid_ts` from its processor, plus NAME.npz with
the indices and grid. Frames are decoded with PyAV (rgb24), all of them, then handed to the processor with their
metadata, so the processor's own sampler chooses (the tiny checkpoints' fps 2, min 4 / max 768 frames).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
VIDEOS = REPO / "assets" / "media" / "videos"
OUT = REPO / "assets" / "golden" / "qwen2vl-hf-sampling"
QWEN2 = REPO / "assets" / "models" / "tiny-qwen2-vl"
QWEN25 = REPO / "assets" / "models" / "tiny-qwen2.5-vl"
FPS = 2.0
PEER_PYTHON = REPO / ".peers" / "vllm-venv" / "bin" / "python"


def decode_all(path: Path) -> tuple[np.ndarray, float]:
    """Every frame as uint8 [T, H, W, 3] and the stream's average frame rate."""
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        fps = float(stream.average_rate)
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(stream)]
    return np.stack(frames), fps


def golden(frames: np.ndarray, fps: float, name: str, video_processor, processor25) -> dict:
    from transformers.video_utils import VideoMetadata

    meta = VideoMetadata(total_num_frames=len(frames), fps=fps, duration=len(frames) / fps,
                         frames_indices=list(range(len(frames))))
    try:
        out = video_processor(videos=[frames], video_metadata=[meta], do_sample_frames=True, fps=FPS,
                              return_metadata=True, return_tensors="pt")
    except Exception as e:  # HF's own sampler can fail on a clip: record why
        return {"error": f"{type(e).__name__}: {e}"}
    pixels = out["pixel_values_videos"].numpy().astype(np.float32)
    indices = [int(i) for i in out["video_metadata"][0].frames_indices]
    text = "<|vision_start|><|video_pad|><|vision_end|>"
    out25 = processor25(text=[text], videos=[frames], video_metadata=[meta], do_sample_frames=True, fps=FPS,
                        return_tensors="pt")
    np.savez(OUT / f"{name}.npz", frame_indices=np.array(indices), video_grid_thw=out["video_grid_thw"].numpy())
    return {"total_frames": len(frames), "fps": fps, "frame_indices": indices,
            "video_grid_thw": out["video_grid_thw"][0].tolist(), "shape": list(pixels.shape),
            "sha256": hashlib.sha256(np.ascontiguousarray(pixels).tobytes()).hexdigest(),
            "second_per_grid_ts": [float(s) for s in out25["second_per_grid_ts"]]}


def hf_side(decoded: Path) -> None:
    """In the peer venv: HF's processors over the decoded frames; writes INDEX.json and the npz files."""
    import transformers
    from transformers import AutoProcessor, AutoVideoProcessor

    OUT.mkdir(parents=True, exist_ok=True)
    video_processor = AutoVideoProcessor.from_pretrained(str(QWEN2))
    processor25 = AutoProcessor.from_pretrained(str(QWEN25))
    info = json.loads((decoded / "info.json").read_text())
    index = {"made_with": f"transformers {transformers.__version__}, frames decoded by PyAV {info.pop('av')}",
             "processor": type(video_processor).__name__, "fps": FPS, "videos": {}}
    for name, fps in sorted(info.items()):
        entry = golden(np.load(decoded / f"{name}.npy"), fps, name, video_processor, processor25)
        index["videos"][name] = entry
        print(name, entry.get("frame_indices", entry.get("error")), file=sys.stderr)
    (OUT / "INDEX.json").write_text(json.dumps(index, indent=1) + "\n")


def main() -> None:
    import av

    with tempfile.TemporaryDirectory() as tmp:
        info: dict[str, object] = {"av": av.__version__}
        for path in sorted(VIDEOS.iterdir()):
            frames, info[path.name] = decode_all(path)
            np.save(Path(tmp) / f"{path.name}.npy", frames)
        (Path(tmp) / "info.json").write_text(json.dumps(info))
        subprocess.run([str(PEER_PYTHON), __file__, "--hf", tmp], check=True, env={"HF_HUB_OFFLINE": "1"})


if __name__ == "__main__":
    hf_side(Path(sys.argv[2])) if sys.argv[1:2] == ["--hf"] else main()
