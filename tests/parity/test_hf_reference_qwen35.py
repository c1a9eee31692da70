"""The HF reference server on tiny Qwen3.5: its prompts are the preparer's ids, its greedy answers and logprobs our
engine's (image, video, both); the parity harness against our server agrees on every turn of its suite."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import httpx
import pytest

from mm_infer import LLM, SamplingParams
from servers.hf_reference.launch import ThreadServer
from servers.openai.config import ServerConfig
from servers.openai.launch import BackgroundServer, free_port

REPO = Path(__file__).resolve().parents[2]
QWEN35 = REPO / "assets" / "models" / "tiny-qwen3.5"
PHOTO = REPO / "assets" / "media" / "images" / "photo.png"
CLIP = REPO / "assets" / "media" / "videos" / "odd7_h264_2fps.mp4"
IMAGE, VIDEO = 3006, 3007  # <|image_pad|> <|video_pad|>


@pytest.fixture(scope="module")
def hf_qwen35() -> Iterator[ThreadServer]:
    with ThreadServer(str(QWEN35)) as srv:
        yield srv


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(str(QWEN35), cpu_threads=1)


def _part(path: Path) -> dict:
    kind, mime = ("video_url", "video/mp4") if path.suffix == ".mp4" else ("image_url", "image/png")
    return {"type": kind, kind: {"url": f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode()}"}}


@pytest.mark.parametrize("media", [[PHOTO], [CLIP], [PHOTO, CLIP]], ids=["image", "video", "both"])
def test_reference_equals_our_engine(hf_qwen35: ThreadServer, llm: LLM, media: list[Path]) -> None:
    body = {"messages": [{"role": "user", "content": [*map(_part, media), {"type": "text", "text": "What?"}]}],
            "max_tokens": 6, "temperature": 0, "logprobs": True, "return_token_ids": True}
    r = httpx.post(f"{hf_qwen35.base_url}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    kinds = ["video" if p.suffix == ".mp4" else "image" for p in media]
    mm: dict[str, list[Path]] = {}
    for k, p in zip(kinds, media, strict=True):
        mm.setdefault(k, []).append(p)
    prompt = {"messages": [{"role": "user", "content": [*({"type": k} for k in kinds),
                                                        {"type": "text", "text": "What?"}]}], "multi_modal_data": mm}
    ref = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=6, logprobs=0), use_tqdm=False)[0]
    got = r.json()
    assert got["prompt_token_ids"] == ref.prompt_token_ids
    assert [IMAGE in ref.prompt_token_ids, VIDEO in ref.prompt_token_ids] == ["image" in kinds, "video" in kinds]
    assert got["choices"][0]["token_ids"] == ref.outputs[0].token_ids
    lps = [e["logprob"] for e in got["choices"][0]["logprobs"]["content"]]
    assert max(abs(a - b) for a, b in zip(lps, ref.outputs[0].logprobs, strict=True)) < 1e-4


def test_parity_harness_ours_vs_the_reference(hf_qwen35: ThreadServer, tmp_path: Path, capsys) -> None:
    from script_modules import load_script

    parity: ModuleType = load_script("peers.parity")
    config = ServerConfig(model_dir=str(QWEN35), port=free_port(),
                          engine_options={"num_kv_blocks": 128, "max_model_len": 2048, "cpu_threads": 1})
    with BackgroundServer(config) as ours:
        report = parity.main(["--a", ours.base_url, "--b", hf_qwen35.base_url, "--reset-prefix-cache",
                              "--out", str(tmp_path / "report.json")])
    agg = report["aggregate"]
    print(f"\nQwen3.5 parity vs HF: {report['summary']}")
    assert agg["errors"] == 0 and report["notes"] == [] and agg["compare"] == "ids" and agg["turns"] == 8
    assert agg["prompt_ids_match"] == 1.0 and agg["exact_match"] == 1.0
    assert agg["max_dlogprob"] < 1e-4 and 1.0 <= agg["token_mult_prob_error"] < 1.0 + 1e-4
    assert report["requests"][-1]["turns"][1]["metrics"]["b_carried_prefix"] is True
