"""RL on tiny Nemotron Omni: rollouts (image and video) and multi-turn rollouts are token-exact against a
teacher-forced HF trainer fed by trainer_hf_inputs; what HF's forward cannot take is refused, naming why."""

from __future__ import annotations

import pytest
import torch
from hybrid_rollout_cases import IMAGES, REPO, VIDEOS, prompt, reward, rows

from mm_infer import LLM, SamplingParams
from mm_infer.models.config import load_config
from mm_infer.prompt.preparer import PromptPreparer
from mm_infer.prompt.request import MediaItem
from mm_infer.rl import (
    completion_logprobs,
    generate_multiturn,
    generate_rollouts,
    hf_inputs,
    masked_logprobs,
    omni_hf_inputs,
    token_mult_prob_error,
    trainer_hf_inputs,
)

OMNI = REPO / "assets" / "models" / "tiny-nemotron-omni"
IMAGE = 3003  # <image>: image and video features alike
TOL = 1e-4


ROWS = rows()


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(str(OMNI), cpu_threads=1, num_kv_blocks=256)


@pytest.fixture(scope="module")
def hf():
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(str(OMNI), dtype=torch.float32).eval()


@torch.no_grad()
def test_rollouts_match_a_teacher_forced_hf_trainer(llm, hf):
    config = load_config(OMNI)
    params = SamplingParams(n=4, temperature=1.0, seed=3, max_tokens=6)
    groups = generate_rollouts(llm.engine, ROWS, reward, params)
    rollout, trainer = [], []
    for group in groups:
        assert len({tuple(s.token_ids) for s in group.samples}) > 1
        for sample in group.samples:
            kw = trainer_hf_inputs(config, group.request, sample.token_ids)
            assert "mm_token_type_ids" not in kw and "image_grid_thw" not in kw  # Qwen's keys, not HF Omni's
            rollout.append(sample.logprobs)
            trainer.append(completion_logprobs(hf(**kw).logits, sample.token_ids))
    worst = max((torch.tensor(r) - t).abs().max().item() for r, t in zip(rollout, trainer, strict=True))
    error = token_mult_prob_error(rollout, trainer)
    print(f"\nOmni rollouts: max |rollout - HF| {worst:.2e}, token_mult_prob_error {error:.8f}")
    assert worst < TOL and 1.0 <= error <= 1.0 + TOL


@torch.no_grad()
def test_multiturn_with_a_video_is_spliced_and_matches_the_trainer(llm, hf):
    # catches: a later turn rebuilt from re-packed media (frame count, frame times lost), so the expanded video's
    # frame labels no longer match and the continuation is refused or expanded again
    row = ROWS[2]
    params = SamplingParams(n=2, temperature=1.0, seed=5, max_tokens=4)
    trajs = generate_multiturn(llm.engine, [row], lambda r, t, x: "And then?" if t == 0 else None,
                               lambda t, g: 0.0, params, max_turns=2)[0]
    first = llm.engine.prepare(row.prompt)
    config = load_config(OMNI)
    rollout, trainer = [], []
    for traj in trajs:
        one, two = traj.turns
        assert one.prompt_token_ids == first.prompt_token_ids
        assert two.prompt_token_ids[:len(one.prompt_token_ids) + len(one.token_ids)] == \
            one.prompt_token_ids + one.token_ids
        ids = traj.token_ids()
        assert ids.count(IMAGE) == first.prompt_token_ids.count(IMAGE)  # the video is expanded once
        kw = trainer_hf_inputs(config, first, ids[len(first.prompt_token_ids):])
        rollout.append(traj.logprobs())
        trainer.append(masked_logprobs(hf(**kw).logits, ids, traj.loss_mask()))
    assert 1.0 <= token_mult_prob_error(rollout, trainer) <= 1.0 + TOL


def test_video_rows_become_hfs_tubelets():
    # catches: rows unpacked in another (channel, patch) order than tubelet_rows wrote them
    from mm_infer.media.omni_video import OmniVideoSpec, tubelet_rows

    spec = OmniVideoSpec((0.5,) * 3, (0.5,) * 3)
    frames = torch.randn(6, 3, 32, 48, generator=torch.Generator().manual_seed(0))  # 3 tubelets of 2 x 3 patches
    rows, grid = tubelet_rows(frames, spec)
    item = MediaItem("video", rows, grid, "v")
    kw = omni_hf_inputs(_request([item], []), [])
    assert torch.equal(kw["pixel_values_videos"], frames.reshape(1, 3, 6, 32, 48))


def _request(items: list[MediaItem], ids: list[int]):
    from mm_infer.prompt.request import VLMRequest

    return VLMRequest([1, *ids, 2], [], items, torch.zeros(3, len(ids) + 2, dtype=torch.long), 0)


def test_images_with_videos_are_refused_because_hf_cannot_take_both(hf):
    preparer = PromptPreparer(OMNI)
    both = preparer.prepare(prompt({"image": [IMAGES / "gray.png"], "video": [VIDEOS / "odd7_h264_2fps.mp4"]}, "?"))
    with pytest.raises(ValueError, match="images and videos together"):
        omni_hf_inputs(both, [])
    image = omni_hf_inputs(preparer.prepare(prompt({"image": [IMAGES / "gray.png"]}, "?")), [])
    video = omni_hf_inputs(preparer.prepare(prompt({"video": [VIDEOS / "odd7_h264_2fps.mp4"]}, "?")), [])
    ids = torch.tensor([both.prompt_token_ids])
    with pytest.raises(Exception, match="feature vectors for"), torch.no_grad():  # HF's own count check
        hf(input_ids=ids, pixel_values=image["pixel_values"], image_grid_hw=image["image_grid_hw"],
           pixel_values_videos=video["pixel_values_videos"])


def test_videos_of_different_grids_and_odd_rows_are_refused():
    preparer = PromptPreparer(OMNI)
    two = preparer.prepare(prompt({"video": [VIDEOS / "odd7_h264_2fps.mp4", VIDEOS / "pan_vp9_10fps.webm"]}, "?"))
    assert two.items[0].grid_thw != two.items[1].grid_thw
    with pytest.raises(ValueError, match="share one grid"):
        omni_hf_inputs(two, [])
    odd = MediaItem("video", torch.zeros(4, 3 * 256), (1, 2, 2), "odd")  # T*C = 3: no whole tubelet
    with pytest.raises(ValueError, match="not T\\*C\\*16\\*16 with T=2"):
        omni_hf_inputs(_request([odd], []), [])


def test_the_family_switch_keeps_qwens_inputs():
    # catches: the dispatcher sending a Qwen checkpoint down the Omni path (or dropping Qwen2.5-VL's seconds)
    model = REPO / "assets" / "models" / "tiny-qwen2.5-vl"
    config = load_config(model)
    req = PromptPreparer(model).prepare({**prompt({"video": [VIDEOS / "odd7_h264_2fps.mp4"]}, "?"),
                                         "mm_processor_kwargs": {"max_pixels": 28 * 28 * 16}})
    got = trainer_hf_inputs(config, req, [5])
    want = hf_inputs(req, [5], image_pad_id=config.image_token_id, video_pad_id=config.video_token_id,
                     second_per_grid_ts=True)
    assert got.keys() == want.keys() and "second_per_grid_ts" in got
    assert all(torch.equal(got[k], want[k]) for k in got)
