"""Logprob shapes as vLLM gives them: legacy top_logprobs for every k (0 included), chat top_logprobs 0, and prompt
logprobs with top-k and real ranks, checked against a teacher-forced HF forward."""

from __future__ import annotations

from functools import cache

import httpx
import pytest
import torch
from server_cases import API_KEY, CKPT

AUTH = {"Authorization": f"Bearer {API_KEY}"}
IDS = [101, 202, 303, 404, 505, 606, 707, 808]


def complete(server, **kw) -> dict:
    body = {"prompt": IDS, "max_tokens": 3, "temperature": 0, "ignore_eos": True, "return_tokens_as_token_ids": True,
            **kw}
    r = httpx.post(f"{server.base_url}/v1/completions", json=body, headers=AUTH, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


@cache
def hf_model() -> torch.nn.Module:
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(CKPT, dtype=torch.float32).eval()


@torch.inference_mode()
def teacher_forced(ids: list[int]) -> torch.Tensor:
    """[len-1, V] log-softmax of the next-token logits at each prompt position (text only: types all 0)."""
    input_ids = torch.tensor([ids])
    logits = hf_model()(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                        mm_token_type_ids=torch.zeros_like(input_ids)).logits[0].float()
    return torch.log_softmax(logits[:-1], dim=-1)


def rank_bounds(row: torch.Tensor, own: float, tol: float = 1e-4) -> tuple[int, int]:
    """vLLM's rank (tokens at least as likely, itself included), allowing float noise to reorder near-ties."""
    return int((row > own + tol).sum()) + 1, int((row >= own - tol).sum())


@pytest.mark.parametrize("k", [0, 2])
def test_legacy_top_logprobs_hold_the_sampled_token_plus_k(server, k):
    lp = complete(server, logprobs=k)["choices"][0]["logprobs"]
    assert lp["top_logprobs"] is not None and len(lp["top_logprobs"]) == len(lp["tokens"]) == 3
    for token, own, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], strict=True):
        assert next(iter(top)) == token and top[token] == own  # the chosen token first, with its logprob
        assert len(top) in (k, k + 1) if k else len(top) == 1  # greedy: the chosen token is the top one
        assert max(top.values()) == own  # greedy picked the most likely


def test_chat_top_logprobs_zero(server):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0, "logprobs": True,
            "top_logprobs": 0}
    r = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, headers=AUTH, timeout=120)
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert len(content) == 3 and all(c["top_logprobs"] == [] and c["logprob"] <= 0 for c in content)
    body = {**body, "logprobs": False}  # top_logprobs 0 without logprobs is fine (vLLM's rule)
    r = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, headers=AUTH, timeout=120)
    assert r.status_code == 200 and r.json()["choices"][0]["logprobs"] is None


def test_prompt_logprobs_top_k_and_ranks_match_hf(server):
    k = 3
    out = complete(server, prompt_logprobs=k, return_token_ids=True)["choices"][0]
    plp = out["prompt_logprobs"]
    assert out["prompt_token_ids"] == IDS and plp[0] is None and len(plp) == len(IDS)
    ref = teacher_forced(IDS)
    for pos, entry in enumerate(plp[1:]):
        token = IDS[pos + 1]
        own = entry[str(token)]
        want = ref[pos, token].item()
        assert abs(own["logprob"] - want) < 1e-4
        assert rank_bounds(ref[pos], want)[0] <= own["rank"] <= rank_bounds(ref[pos], want)[1]  # 1: most likely
        assert own["decoded_token"] == f"token_id:{token}"
        values, idx = torch.topk(ref[pos], k)
        alts = {int(t): entry[str(int(t))] for t in idx}
        assert [a["rank"] for a in alts.values()] == [1, 2, 3]
        for t, v in zip(idx.tolist(), values.tolist(), strict=True):
            assert abs(alts[t]["logprob"] - v) < 1e-4
        assert len(entry) in (k, k + 1)


def test_prompt_logprobs_zero_has_ranks_and_limits(server):
    plp = complete(server, prompt_logprobs=0)["choices"][0]["prompt_logprobs"]
    ref = teacher_forced(IDS)
    ranks = [next(iter(e.values()))["rank"] for e in plp[1:]]
    bounds = [rank_bounds(ref[p], ref[p, IDS[p + 1]].item()) for p in range(len(IDS) - 1)]
    assert all(lo <= r <= hi for r, (lo, hi) in zip(ranks, bounds, strict=True)), (ranks, bounds)
    for body in ({"prompt_logprobs": 21}, {"prompt_logprobs": 2, "stream": True}):
        r = httpx.post(f"{server.base_url}/v1/completions", json={"prompt": IDS, "max_tokens": 1, **body},
                       headers=AUTH, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt_logprobs", r.text


def test_echo_logprobs_match_hf(server):
    lp = complete(server, echo=True, max_tokens=0, logprobs=1)["choices"][0]["logprobs"]
    ref = teacher_forced(IDS)
    assert lp["tokens"] == [f"token_id:{t}" for t in IDS] and lp["token_logprobs"][0] is None
    for pos, (own, top) in enumerate(zip(lp["token_logprobs"][1:], lp["top_logprobs"][1:], strict=True)):
        assert abs(own - ref[pos, IDS[pos + 1]].item()) < 1e-4
        best = int(ref[pos].argmax())
        assert abs(top[f"token_id:{best}"] - ref[pos, best].item()) < 1e-4  # the chosen token + the top 1


def test_chat_top_logprobs_list_the_sampled_token_first_as_vllm_does(server):
    # vLLM builds each position's logprob dict with the sampled token first, then the top k, and the chat answer
    # takes its first k entries. When a bias makes a low-ranked token the greedy pick, that token leads the list
    # and the raw top alternatives follow. Catches a plain top-k list (the biased token would be missing).
    def ask(bias: dict[str, float] | None) -> dict:
        body = {"messages": [{"role": "user", "content": "Describe a quiet street."}], "max_tokens": 2,
                "temperature": 0, "logprobs": True, "top_logprobs": 3, "return_tokens_as_token_ids": True,
                "logit_bias": bias}
        r = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, headers=AUTH, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["logprobs"]["content"][0]

    plain = ask(None)
    ranked = [t["token"] for t in plain["top_logprobs"]]
    assert ranked[0] == plain["token"]  # unbiased greedy: the sampled token is the top one
    forced = 1234
    biased = ask({str(forced): 100.0})
    tops = biased["top_logprobs"]
    assert biased["token"] == f"token_id:{forced}" and tops[0]["token"] == biased["token"]
    assert tops[0]["logprob"] == biased["logprob"] < plain["top_logprobs"][-1]["logprob"]  # raw logprob: low
    assert [t["token"] for t in tops[1:]] == ranked[:2]  # then the raw top alternatives, in rank order
