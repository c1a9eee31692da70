"""Prompt logprobs of a media prompt: each token's own logprob, its rank and the top-k, against a teacher-forced HF
forward (M-RoPE and vision embeddings included)."""

from __future__ import annotations

import torch
from engine_cases import case, expand, hf_kwargs, hf_model

from mm_infer import SamplingParams

PROMPT = case([5, ("image", 1, 4, 4), 7], seed=31)


@torch.inference_mode()
def test_prompt_ranks_and_top_k_match_hf(llm):
    k = 4
    out = llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=k), use_tqdm=False)[0]
    ids = expand(PROMPT)
    ref = torch.log_softmax(hf_model()(**hf_kwargs(PROMPT, ids)).logits[0, :-1].float(), dim=-1)  # [L-1, V]
    own = ref.gather(1, torch.tensor(ids[1:])[:, None])  # [L-1, 1]
    lo = ((ref > own + 1e-4).sum(dim=-1) + 1).tolist()  # rank = tokens at least as likely, itself included;
    hi = (ref >= own - 1e-4).sum(dim=-1).tolist()  # float noise may reorder near-ties only
    ranks = out.prompt_ranks
    assert ranks[0] is None and len(ranks) == len(ids)
    assert all(a <= r <= b for a, r, b in zip(lo, ranks[1:], hi, strict=True)), (lo, ranks, hi)
    assert len(set(ranks[1:])) > 1 and all(1 <= r <= ref.shape[1] for r in ranks[1:])
    for pos, alts in enumerate(out.prompt_top_logprobs[1:]):
        values, idx = torch.topk(ref[pos], k)
        assert list(alts) == idx.tolist()
        assert max(abs(alts[t] - v) for t, v in zip(idx.tolist(), values.tolist(), strict=True)) < 1e-4
    none = llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=1), use_tqdm=False)[0]
    assert none.prompt_ranks is None
