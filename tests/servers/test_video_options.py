"""Per-request video options on the server: the frame rule, fps / num_frames / do_sample_frames / frame_indices,
vLLM's media_io_kwargs, the caps, and the frame indices echoed back (/tokenize placeholders, chat prompt_media)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from server_cases import API_KEY, CKPT, MEDIA, REPO, SMALL, data_url

from mm_infer.media import preprocess_videos
from servers.openai.config import MediaCaps, ServerConfig
from servers.openai.launch import BackgroundServer, free_port

VIDEO = MEDIA / "videos" / "pan_h264_24fps.mp4"  # 48 frames at 24 fps
GOLDEN = json.loads((REPO / "assets" / "golden" / "qwen2vl-hf-sampling" / "INDEX.json").read_text())["videos"]
HEADERS = {"Authorization": f"Bearer {API_KEY}"}


def _messages() -> list[dict]:
    return [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": data_url(VIDEO, "video/mp4")}},
                                         {"type": "text", "text": "What moves?"}]}]


def _tokenize(base: str, **extra) -> httpx.Response:
    return httpx.post(f"{base}/tokenize", json={"messages": _messages(), **extra}, headers=HEADERS, timeout=60)


def _frames(base: str, **extra) -> list[int]:
    r = _tokenize(base, **extra)
    assert r.status_code == 200, r.text
    (video,) = [p for p in r.json()["placeholders"] if p["modality"] == "video"]
    return video["frame_indices"]


def _error(r: httpx.Response, status: int, *words: str) -> None:
    assert r.status_code == status, r.text
    message = r.json()["error"]["message"]
    assert all(w in message for w in words), message


def test_default_frames_are_hf_processors(server) -> None:
    assert _frames(server.base_url) == GOLDEN[VIDEO.name]["frame_indices"] == [0, 12, 24, 36]


@pytest.mark.parametrize(("kwargs", "frames"), [
    ({"sampler": "qwen"}, [0, 16, 31, 47]),
    ({"sampler": "vllm", "num_frames": 8}, [0, 12, 24, 36]),  # vLLM's rule ignores num_frames
    ({"num_frames": 6}, [0, 8, 16, 24, 32, 40]),
    ({"fps": 4}, [0, 6, 12, 18, 24, 30, 36, 42]),
    ({"do_sample_frames": False}, list(range(48))),
    ({"frame_indices": [3, 9, 27]}, [3, 9, 27]),
])
def test_mm_processor_kwargs_choose_the_frames(server, kwargs: dict, frames: list[int]) -> None:
    assert _frames(server.base_url, mm_processor_kwargs=kwargs) == frames
    expected, _ = preprocess_videos([VIDEO], **{"sampler": "hf", **kwargs})  # the library agrees on the count
    assert len(frames) == int(expected.num_frames[0])


def test_media_io_kwargs_as_vllm_takes_them(server) -> None:
    assert _frames(server.base_url, media_io_kwargs={"video": {"num_frames": 6}}) == [0, 8, 16, 24, 32, 40]
    # mm_processor_kwargs win over media_io_kwargs; fps there drops media_io's num_frames (vLLM's merge)
    assert _frames(server.base_url, media_io_kwargs={"video": {"num_frames": 6}},
                   mm_processor_kwargs={"fps": 4}) == [0, 6, 12, 18, 24, 30, 36, 42]


@pytest.mark.parametrize(("extra", "words"), [
    ({"mm_processor_kwargs": {"sampler": "uniform"}}, ("mm_processor_kwargs.sampler", "hf, vllm, qwen, qwen3")),
    ({"mm_processor_kwargs": {"fps": 2, "num_frames": 4}}, ("mutually exclusive",)),
    ({"mm_processor_kwargs": {"num_frames": 10_000}}, ("num_frames=10000", "cap of 768")),
    ({"mm_processor_kwargs": {"fps": 31}}, ("fps=31", "cap of 30")),
    ({"mm_processor_kwargs": {"do_sample_frames": "yes"}}, ("do_sample_frames", "true or false")),
    ({"mm_processor_kwargs": {"frame_indices": [1, -2]}}, ("frame_indices", "integers >= 0")),
    ({"mm_processor_kwargs": {"frame_indices": list(range(769))}}, ("769 frames", "cap of 768")),
    ({"media_io_kwargs": {"video": {"backend": "opencv"}}}, ("media_io_kwargs.video", "backend")),
    ({"media_io_kwargs": {"audio": {}}}, ("media_io_kwargs", "audio")),
])
def test_bad_video_options_are_400_naming_them(server, extra: dict, words: tuple[str, ...]) -> None:
    _error(_tokenize(server.base_url, **extra), 400, *words)


def test_frame_past_the_end_and_count_past_the_clip_are_400(server) -> None:
    _error(_tokenize(server.base_url, mm_processor_kwargs={"frame_indices": [0, 48]}), 400, "[48] out of range",
           "48 frames")
    _error(_tokenize(server.base_url, mm_processor_kwargs={"num_frames": 60}), 400, "60 frames", "48 frames")


def test_chat_returns_the_frames_with_the_ids(server) -> None:
    body = {"messages": _messages(), "max_tokens": 2, "temperature": 0, "return_token_ids": True,
            "mm_processor_kwargs": {"num_frames": 6, "video_max_pixels": SMALL}}
    r = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, headers=HEADERS, timeout=60).json()
    (media,) = r["prompt_media"]
    assert media["modality"] == "video" and media["frame_indices"] == [0, 8, 16, 24, 32, 40]
    assert media["grid_thw"][0] == 3 and media["second_per_grid_t"] == pytest.approx(2 / (6 / 48 * 24))
    tok = _tokenize(server.base_url, mm_processor_kwargs=body["mm_processor_kwargs"]).json()
    assert tok["tokens"] == r["prompt_token_ids"]
    streamed = httpx.post(f"{server.base_url}/v1/chat/completions", json={**body, "stream": True},
                          headers=HEADERS, timeout=60).text
    first = json.loads(streamed.split("data: ")[1])
    assert first["prompt_media"] == r["prompt_media"]


def test_replaying_the_returned_frames_gives_the_same_prompt(server) -> None:
    ids = _tokenize(server.base_url, mm_processor_kwargs={"sampler": "qwen"}).json()["tokens"]
    frames = _frames(server.base_url, mm_processor_kwargs={"sampler": "qwen"})
    again = _tokenize(server.base_url, mm_processor_kwargs={"frame_indices": frames}).json()["tokens"]
    assert again == ids


@pytest.fixture(scope="module")
def num_frames_server() -> Iterator[BackgroundServer]:
    """--media-io-kwargs '{"video": {"num_frames": 6}}' --max-video-fps 8."""
    config = ServerConfig(model_dir=str(CKPT), port=free_port(), engine_options={"num_kv_blocks": 64},
                          caps=MediaCaps(video_defaults=(("num_frames", 6),), max_video_fps=8))
    with BackgroundServer(config) as srv:
        yield srv


def test_server_video_defaults_and_fps_cap(num_frames_server) -> None:
    base = num_frames_server.base_url
    assert _frames(base) == [0, 8, 16, 24, 32, 40]
    assert _frames(base, mm_processor_kwargs={"fps": 4}) == [0, 6, 12, 18, 24, 30, 36, 42]
    _error(_tokenize(base, mm_processor_kwargs={"fps": 9}), 400, "fps=9", "cap of 8")


def test_cli_video_flags() -> None:
    import argparse

    from mm_infer.media.frame_sampling import SAMPLERS
    from servers.cli import server_config
    from servers.cli_flags import VIDEO_SAMPLERS, add_serve_flags, media_io_kwargs

    assert VIDEO_SAMPLERS == SAMPLERS
    assert media_io_kwargs('{"video": {"num_frames": 8}}') == (("num_frames", 8),)
    for bad, why in [('{"video": {"fps": 1, "num_frames": 2}}', "mutually exclusive"),
                     ('{"video": {"backend": "opencv"}}', "backend"), ('{"image": {}}', "expected"),
                     ('{"video": {"num_frames": 0}}', "positive integer"), ("{", "not valid JSON")]:
        with pytest.raises(argparse.ArgumentTypeError, match=why):
            media_io_kwargs(bad)
    parser = argparse.ArgumentParser()
    add_serve_flags(parser)
    args = parser.parse_args([str(CKPT), "--media-io-kwargs", '{"video": {"fps": 1}}', "--max-video-fps", "4",
                              "--video-sampler", "qwen", "--mrope-after-video", "vllm"])
    config = server_config(args)
    assert config.caps.video_defaults == (("fps", 1),) and config.caps.max_video_fps == 4
    assert config.engine_options["video_sampler"] == "qwen" and config.engine_options["mrope_after_video"] == "vllm"
