"""The HF reference server's own API: RL token fields, seeded sampling, and the requests it refuses."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import torch
from parity_cases import CKPT

from mm_infer.data import ChatEncoder, make_sample
from mm_infer.data.media_urls import image_url
from servers.hf_reference.launch import ThreadServer
from servers.hf_reference.model import GenParams
from servers.hf_reference.prompt import Prompt


def _messages(url: str | None = None) -> list[dict[str, Any]]:
    sample = make_sample(0, 0, "colour")
    part = {"type": "image_url", "image_url": {"url": url or image_url(sample.media)}}
    return [{"role": "user", "content": [part, {"type": "text", "text": sample.question}]}]


def _chat(srv: ThreadServer, **body: Any) -> httpx.Response:
    return httpx.post(f"{srv.base_url}/v1/chat/completions", json={"messages": _messages(), **body}, timeout=120)


def test_token_fields_and_logprobs(hf_full: ThreadServer) -> None:
    body = _chat(hf_full, max_tokens=5, temperature=0, logprobs=True, top_logprobs=3, return_token_ids=True).json()
    choice, msg = body["choices"][0], body["choices"][0]["message"]
    assert choice["token_ids"] == msg["generation_token_ids"] and len(choice["token_ids"]) == 5
    assert body["prompt_token_ids"] == msg["prompt_token_ids"] and body["usage"]["prompt_tokens"] == len(
        body["prompt_token_ids"])
    pads = ChatEncoder.from_dir(CKPT).encode(make_sample(0, 0, "colour")).prompt_ids.count(3006)
    assert body["prompt_token_ids"].count(3006) == pads > 0  # <|image_pad|> expanded as for training
    content = choice["logprobs"]["content"]
    assert [c["logprob"] for c in content] == msg["generation_log_probs"]
    for c in content:  # greedy: the chosen token is the top alternative
        tops = c["top_logprobs"]
        assert len(tops) == 3 and tops[0]["logprob"] == c["logprob"]
        assert tops[0]["logprob"] >= tops[1]["logprob"] >= tops[2]["logprob"]
    plain = _chat(hf_full, max_tokens=5, temperature=0).json()
    assert "token_ids" not in plain["choices"][0] and "prompt_token_ids" not in plain
    assert plain["choices"][0]["message"]["generation_token_ids"] == choice["token_ids"]


def test_seeded_sampling_repeats(hf_full: ThreadServer) -> None:
    def ids(seed: int) -> list[int]:
        return _chat(hf_full, max_tokens=8, temperature=1.0, seed=seed).json()["choices"][0]["message"][
            "generation_token_ids"]

    assert ids(7) == ids(7)
    assert ids(7) != ids(8)


@pytest.mark.parametrize(("body", "words"), [
    ({"max_tokens": 4, "n": 2}, "n=1"),
    ({"max_tokens": 4, "best_of": 2}, "best_of"),
    ({"max_tokens": 4, "messages": _messages("http://127.0.0.1/x.png")}, "data: URLs"),
])
def test_refuses_what_it_cannot_answer(hf_full: ThreadServer, body: dict[str, Any], words: str) -> None:
    resp = _chat(hf_full, **body)
    assert resp.status_code == 400 and words in resp.json()["error"]["message"]


def test_logprobs_match_a_teacher_forced_forward(hf_full: ThreadServer) -> None:
    """The oracle's own check: generate's per-step logits equal one full forward over prompt + generated ids."""
    ref = hf_full.reference
    prompt = ref.builder.build(_messages())
    gen = ref.model.generate(prompt, GenParams(max_tokens=6, temperature=0.0))
    full = Prompt(prompt.token_ids + gen.token_ids, prompt.images, prompt.videos, prompt.second_per_grid_ts)
    with torch.inference_mode():
        logits = ref.model.model(**ref.model.inputs(full)).logits[0].float()  # [L, V]
    n = len(prompt.token_ids)
    lp = torch.log_softmax(logits[n - 1:-1], dim=-1)  # the positions that predicted each generated token
    forced = lp[torch.arange(len(gen.token_ids)), torch.tensor(gen.token_ids)]
    assert gen.token_ids == lp.argmax(-1).tolist()
    assert torch.allclose(forced, torch.tensor(gen.logprobs), atol=1e-5, rtol=0)
