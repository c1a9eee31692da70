"""Fixed server requests whose answers are recorded once per family (`python tests/distributed/recorded_wires.py`)
and replayed on every wire: the engine on a thread, the engine-core process, and 2 Ray replicas.

The guard of a restructuring that moves outputs between processes: every wire must give the recorded ids, text,
finish reasons and top-k token sets exactly and every logprob within `LOGPROB_ATOL` (DESIGN.md, "Portable exactness").
"""

from __future__ import annotations

import base64
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]
RECORD = Path(__file__).with_name("recorded_wires.json")
FAMILIES = {"qwen2": "tiny-qwen2-vl", "qwen25": "tiny-qwen2.5-vl", "qwen3": "tiny-qwen3-vl",
            "qwen3_moe": "tiny-qwen3-vl-moe"}
OPTIONS: dict[str, Any] = {"num_kv_blocks": 256, "max_model_len": 2048, "cpu_threads": 1, "batch_invariant": True}
FAMILY_OPTIONS: dict[str, dict[str, Any]] = {"qwen3_moe": {"enable_return_routed_experts": True}}  # R3 on every wire


def _routing_digest(encoded: str) -> str:
    """R3's base64 .npy as shape, dtype and a hash of the ids (a few KB per choice otherwise)."""
    import io

    import numpy as np

    ids = np.load(io.BytesIO(base64.b64decode(encoded)), allow_pickle=False)
    return f"{ids.shape} {ids.dtype} {hashlib.sha256(ids.tobytes()).hexdigest()[:16]}"


def _data_url(path: Path, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode()}"


def requests() -> list[tuple[str, str, dict[str, Any]]]:
    """(name, route, body): an image chat with top logprobs, a streamed video chat with n=2 sampled, and a
    completions batch with a stop string: the three ways an answer is assembled."""
    image = _data_url(REPO / "assets/media/shapes/colour_example.png", "image/png")
    video = _data_url(REPO / "assets/media/videos/odd7_h264_2fps.mp4", "video/mp4")
    return [
        ("image_chat", "/v1/chat/completions", {
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": image}},
                                                      {"type": "text", "text": "What colour?"}]}],
            "temperature": 0.0, "max_tokens": 12, "ignore_eos": True, "logprobs": True, "top_logprobs": 2,
            "return_token_ids": True}),
        ("video_chat_stream", "/v1/chat/completions", {
            "messages": [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": video}},
                                                      {"type": "text", "text": "What moves?"}]}],
            "n": 2, "temperature": 0.8, "top_k": 20, "seed": 3, "max_tokens": 8, "ignore_eos": True,
            "logprobs": True, "return_token_ids": True, "stream": True, "mm_processor_kwargs": {"fps": 2.0}}),
        ("completions_stop", "/v1/completions", {
            "prompt": ["one two three", "The quick brown fox"], "temperature": 1.0, "seed": 5, "max_tokens": 20,
            "stop": ["e", "th"], "ignore_eos": True, "logprobs": 1, "return_token_ids": True}),
    ]


def _choice(choice: dict[str, Any], route: str) -> dict[str, Any]:
    """The parts of one whole choice a trainer reads, floats as repr strings."""
    if route == "/v1/chat/completions":
        text = choice["message"]["content"]
        lp = [(e["token"], repr(e["logprob"]), {t["token"]: repr(t["logprob"]) for t in e["top_logprobs"]})
              for e in choice["logprobs"]["content"]]
    else:
        text = choice["text"]
        lp = [(tok, repr(v), {k: repr(x) for k, x in (top or {}).items()})
              for tok, v, top in zip(choice["logprobs"]["tokens"], choice["logprobs"]["token_logprobs"],
                                     choice["logprobs"]["top_logprobs"], strict=True)]
    out = {"index": choice["index"], "text": text, "token_ids": choice["token_ids"],
           "finish_reason": choice["finish_reason"], "stop_reason": choice.get("stop_reason"), "logprobs": lp}
    if choice.get("routed_experts") is not None:
        out["routed_experts"] = _routing_digest(choice["routed_experts"])
    return out


def _streamed(lines: list[str]) -> list[dict[str, Any]]:
    """Deltas of a chat stream added up per choice, in the shape `_choice` gives a whole answer."""
    acc: dict[int, dict[str, Any]] = {}
    for line in lines:
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        for ch in json.loads(line[6:]).get("choices", []):
            one = acc.setdefault(ch["index"], {"index": ch["index"], "text": "", "token_ids": [],
                                               "finish_reason": None, "stop_reason": None, "logprobs": []})
            one["text"] += ch["delta"].get("content") or ""
            one["token_ids"] += ch.get("token_ids") or []
            one["finish_reason"] = ch.get("finish_reason") or one["finish_reason"]
            one["stop_reason"] = ch.get("stop_reason", one["stop_reason"])
            for e in (ch.get("logprobs") or {}).get("content") or []:
                one["logprobs"].append((e["token"], repr(e["logprob"]),
                                        {t["token"]: repr(t["logprob"]) for t in e["top_logprobs"]}))
    return [acc[i] for i in sorted(acc)]


def ask(base: str) -> dict[str, Any]:
    """Every request, one after another (batch-invariant engines: the answer does not depend on the batch)."""
    record: dict[str, Any] = {}
    with httpx.Client(base_url=base, timeout=120) as http:
        for name, route, body in requests():
            body = {"model": "tiny", **body}
            if body.get("stream"):
                with http.stream("POST", route, json=body) as reply:
                    assert reply.status_code == 200, reply.read()
                    record[name] = _streamed(list(reply.iter_lines()))
            else:
                reply = http.post(route, json=body)
                assert reply.status_code == 200, reply.text
                answer = reply.json()
                record[name] = {"prompt_token_ids": answer.get("prompt_token_ids")
                                or [c.get("prompt_token_ids") for c in answer["choices"]],
                                "choices": [_choice(c, route) for c in answer["choices"]]}
    return record


def serve_and_ask(family: str, wire: str) -> dict[str, Any]:
    """Start a server on `wire` ("thread", "process" or "replicas": 2 Ray actors) over one family, ask, stop."""
    from servers.openai.config import ServerConfig
    from servers.openai.launch import BackgroundServer, free_port

    config = ServerConfig(model_dir=str(REPO / "assets" / "models" / FAMILIES[family]), served_model_name="tiny",
                          port=free_port(), engine_options={**OPTIONS, **FAMILY_OPTIONS.get(family, {})},
                          engine_core="process" if wire == "process" else "thread",
                          replicas=2 if wire == "replicas" else None)
    server = BackgroundServer(config).start()
    try:
        return ask(server.base_url)
    finally:
        server.stop()


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    only = sys.argv[1:] or list(FAMILIES)  # re-record some families, keep the others as recorded
    old = json.loads(RECORD.read_text()) if RECORD.exists() else {}
    RECORD.write_text(json.dumps({f: serve_and_ask(f, "thread") if f in only else old[f] for f in FAMILIES},
                                 indent=1) + "\n")
    print(f"wrote {RECORD}")
