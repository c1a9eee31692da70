"""The engine on a tiny Nemotron Omni with its Parakeet audio tower (float32 CPU): a prompt with an audio clip (and
one with an image beside it) gives HF generate's greedy ids, logprobs within 1e-4 of a teacher-forced HF forward."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import torch

from mm_infer import LLM, SamplingParams
from mm_infer.media.omni_audio import AudioFeatureSpec, audio_features, token_count
from mm_infer.prompt.placeholders import PlaceholderRange
from mm_infer.prompt.request import MediaItem, VLMRequest
from tests.media.test_omni_audio_features import clips
from tests.models.nemotron_omni_cases import text_ids

CKPT = Path(__file__).resolve().parents[2] / "assets" / "models" / "tiny-nemotron-omni-audio"
SPEC = AudioFeatureSpec(feature_size=80)


@cache
def hf():
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(CKPT, dtype=torch.float32).eval()


def ids_of(*tokens: str) -> list[int]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(CKPT / "tokenizer.json"))
    return [tok.token_to_id(t) for t in tokens]


def audio_request(wave: torch.Tensor, seed: int) -> tuple[VLMRequest, dict]:
    """(our prepared request: text, <so_start> <so_embedding> x n <so_end>, text; HF's inputs for the same)."""
    start, emb, end = ids_of("<so_start>", "<so_embedding>", "<so_end>")
    features, length = audio_features(wave, SPEC)
    n = token_count(wave.numel(), SPEC)
    before, after = text_ids(6, seed), text_ids(9, seed + 1)
    ids = before + [start, *[emb] * n, end] + after
    item = MediaItem("audio", features, (1, features.shape[0], 1), f"clip-{seed}", tokens=n)
    req = VLMRequest(ids, [PlaceholderRange(len(before) + 1, n, "audio", item.content_hash, 0, 0)], [item],
                     torch.arange(len(ids)).expand(3, -1).clone(), 0)
    mask = torch.zeros(1, features.shape[0], dtype=torch.long)
    mask[0, :length] = 1
    return req, dict(input_ids=torch.tensor([ids]), input_features=features[None], input_features_mask=mask)


@torch.no_grad()
def test_audio_prompts_equal_hf_generate_and_a_teacher_forced_forward():
    # catches: the clip's rows spliced into the wrong tokens, the valid length off by one (HF keeps F - 1 frames
    # plus its +1 trim rule), the audio tower skipped
    llm = LLM(str(CKPT), cpu_threads=1)
    worst = 0.0
    for k, wave in enumerate(clips()[:2]):
        req, inputs = audio_request(wave, 40 + k)
        out = llm.generate([req], SamplingParams(temperature=0.0, max_tokens=8, logprobs=0), use_tqdm=False)[0]
        got = out.outputs[0]
        want = hf().generate(**inputs, max_new_tokens=8, do_sample=False)[0, len(req.prompt_token_ids):].tolist()
        assert got.token_ids == want
        full = dict(inputs, input_ids=torch.tensor([req.prompt_token_ids + got.token_ids]))
        logits = hf()(**full).logits[0, len(req.prompt_token_ids) - 1:-1].float()
        forced = torch.log_softmax(logits, -1).gather(1, torch.tensor(got.token_ids)[:, None])[:, 0]
        worst = max(worst, (torch.tensor(got.logprobs) - forced).abs().max().item())
    print(f"\naudio prompts: greedy ids = HF generate; |logprobs - teacher-forced HF| max {worst:.2e}")
    assert worst < 1e-4


@torch.no_grad()
def test_trainer_inputs_carry_the_audio():
    # catches: trainer_hf_inputs dropping the clip (HF's forward would then fail its <so_embedding> count) or its
    # mask off by one frame
    from mm_infer.models.config import load_config
    from mm_infer.rl import completion_logprobs, trainer_hf_inputs

    llm = LLM(str(CKPT), cpu_threads=1)
    req, _ = audio_request(clips()[0], 50)
    out = llm.generate([req], SamplingParams(temperature=0.0, max_tokens=5, logprobs=0), use_tqdm=False)[0]
    kw = trainer_hf_inputs(load_config(CKPT), req, out.outputs[0].token_ids)
    ref = completion_logprobs(hf()(**kw).logits, out.outputs[0].token_ids)
    assert (torch.tensor(out.outputs[0].logprobs) - ref).abs().max().item() < 1e-4
