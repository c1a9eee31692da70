"""The HF reference server on tiny Nemotron Omni: its prompts are the preparer's ids (the HF tokenizer through the
same expansion), its greedy answers and logprobs our engine's; image + video together is a 400 naming HF's limit."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from mm_infer import LLM, SamplingParams
from servers.hf_reference.launch import ThreadServer

REPO = Path(__file__).resolve().parents[2]
OMNI = REPO / "assets" / "models" / "tiny-nemotron-omni"
PHOTO = REPO / "assets" / "media" / "images" / "photo.png"
CLIP = REPO / "assets" / "media" / "videos" / "odd7_h264_2fps.mp4"


@pytest.fixture(scope="module")
def hf_omni() -> Iterator[ThreadServer]:
    with ThreadServer(str(OMNI)) as srv:
        yield srv


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(str(OMNI), cpu_threads=1)


def _url(path: Path) -> str:
    import base64

    mime = "video/mp4" if path.suffix == ".mp4" else "image/png"
    return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode()}"


def _part(path: Path) -> dict:
    kind = "video_url" if path.suffix == ".mp4" else "image_url"
    return {"type": kind, kind: {"url": _url(path)}}


@pytest.mark.parametrize("media", [[PHOTO], [CLIP]], ids=["image", "video"])
def test_reference_equals_our_engine(hf_omni: ThreadServer, llm: LLM, media: list[Path]) -> None:
    body = {"messages": [{"role": "user", "content": [*map(_part, media), {"type": "text", "text": "What?"}]}],
            "max_tokens": 6, "temperature": 0, "logprobs": True, "return_token_ids": True}
    r = httpx.post(f"{hf_omni.base_url}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    kind = "video" if media[0].suffix == ".mp4" else "image"
    prompt = {"messages": [{"role": "user", "content": [{"type": kind}, {"type": "text", "text": "What?"}]}],
              "multi_modal_data": {kind: media}}
    ref = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=6, logprobs=0), use_tqdm=False)[0]
    got = r.json()
    assert got["prompt_token_ids"] == ref.prompt_token_ids and 3003 in ref.prompt_token_ids  # <image> expanded
    assert got["choices"][0]["token_ids"] == ref.outputs[0].token_ids
    lps = [e["logprob"] for e in got["choices"][0]["logprobs"]["content"]]
    assert max(abs(a - b) for a, b in zip(lps, ref.outputs[0].logprobs, strict=True)) < 1e-4


def test_image_and_video_together_is_a_400_naming_why(hf_omni: ThreadServer) -> None:
    body = {"messages": [{"role": "user", "content": [_part(PHOTO), _part(CLIP)]}], "max_tokens": 2}
    r = httpx.post(f"{hf_omni.base_url}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 400 and "images and videos together" in r.json()["error"]["message"], r.text


def test_an_omni_prompt_without_its_request_is_refused(hf_omni: ThreadServer) -> None:
    from servers.hf_reference.prompt import Prompt

    with pytest.raises(ValueError, match="needs its prepared request"):
        hf_omni.reference.model.inputs(Prompt([1, 2], None, None, None))
