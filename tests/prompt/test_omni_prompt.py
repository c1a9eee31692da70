"""Nemotron Omni prompts: PromptPreparer's ids against HF 5.24's processor on the same rendered text (goldens)."""

from __future__ import annotations

import dataclasses
from functools import lru_cache

import pytest
import torch

from mm_infer.models.config import load_config
from mm_infer.prompt.omni_placeholders import frame_labels
from mm_infer.prompt.placeholders import PromptError
from mm_infer.prompt.preparer import PromptPreparer
from tests.media.test_omni_image import ARRAYS, GOLDEN, MODEL, REPO

PROMPTS = GOLDEN["prompts"]


@lru_cache(maxsize=1)
def preparer() -> PromptPreparer:
    return PromptPreparer(MODEL)


def request(name: str, **extra) -> dict:
    """The golden prompt case as a library prompt dict (messages + multi_modal_data + the video's kwargs)."""
    case = PROMPTS[name]
    mm, kw = {}, {}
    if case["images"]:
        mm["image"] = [REPO / GOLDEN["images"][i]["path"] for i in case["images"]]
    if case["video"]:
        v = GOLDEN["videos"][case["video"]]
        mm["video"] = [ARRAYS["frames/frames5"] if v["source"].startswith("synthetic:") else REPO / v["source"]]
        kw = v["kwargs"]
    return {"messages": case["messages"], "multi_modal_data": mm, "mm_processor_kwargs": kw, **extra}


@pytest.mark.parametrize("name", sorted(PROMPTS))
def test_prompt_ids_match_hf(name: str) -> None:
    # catches: video features put in <video> tokens, labels without times or with index/fps seconds, a missing
    # "\n" between tubelet chunks, items out of prompt order (video_then_image), the "Look: " + "Frame" stretch
    # tokenized apart (HF tokenizes them together: " Frame" is one token)
    req = preparer().prepare(request(name))
    assert req.prompt_token_ids == PROMPTS[name]["input_ids"]
    pads = [i for i, t in enumerate(req.prompt_token_ids) if t == load_config(MODEL).image_token_id]
    assert [i for r in req.placeholders for i in range(r.offset, r.end)] == pads  # one range per run, all of them
    firsts = [r for r in req.placeholders if r.item_offset == 0]  # each item's first run, in prompt order
    assert [r.item_index for r in firsts] == list(range(len(req.items)))
    assert [r.modality for r in firsts] == [it.modality for it in req.items]
    assert torch.equal(req.mrope_positions, torch.arange(len(req.prompt_token_ids)).expand(3, -1))
    assert req.mrope_delta == 0


def test_video_ranges_point_at_tubelet_rows() -> None:
    # catches: every tubelet run pointing at feature row 0 (item_offset), the engine would splice tubelet 0 4 times
    req = preparer().prepare(request("video"))
    assert [(r.length, r.item_index, r.item_offset) for r in req.placeholders] == [(12, 0, 12 * k) for k in range(4)]
    assert req.items[0].num_tokens(2) == 48 and req.items[0].grid_thw == (4, 6, 8)


def test_first_label_is_tokenized_with_the_text_before_it() -> None:
    # the "video_then_image" golden passes only because of this: the naive split gives other ids
    tok = preparer().tokenizer
    label = "Frame 1 sampled at 0.00 seconds and frame 2 sampled at 0.49 seconds: "
    assert tok.encode("Look: " + label, add_special_tokens=False) != (
        tok.encode("Look: ", add_special_tokens=False) + tok.encode(label, add_special_tokens=False))


@pytest.mark.parametrize("name", ["image", "video", "video_then_image", "two_images", "frames_no_fps"])
@pytest.mark.parametrize("flag", [True, False])
def test_expanded_prompts_are_checked_not_expanded_twice(name: str, flag: bool) -> None:
    # catches: expanding an expanded run again (NeMo-RL sends the expanded text), with or without the flag
    want = PROMPTS[name]["input_ids"]
    ref = preparer().prepare(request(name))
    req = preparer().prepare({**request(name), "messages": None, "prompt_token_ids": want,
                              "media_tokens_preexpanded": flag})
    assert req.prompt_token_ids == want and req.placeholders == ref.placeholders
    text = preparer().prepare({**request(name), "messages": None, "prompt": PROMPTS[name]["expanded"],
                               "media_tokens_preexpanded": flag})
    assert text.prompt_token_ids == want


@pytest.mark.parametrize(("name", "item"), [("image", "image 0"), ("video", "video 0"),
                                            ("two_images", "image 1")])
def test_wrong_expanded_count_names_the_item(name: str, item: str) -> None:
    # catches: a pre-expanded run one token short accepted (features and placeholders would not line up)
    ids = list(PROMPTS[name]["input_ids"])
    pad = load_config(MODEL).image_token_id
    last = max(i for i, t in enumerate(ids) if t == pad)
    del ids[last]
    with pytest.raises(PromptError, match=item):
        preparer().prepare({**request(name), "messages": None, "prompt_token_ids": ids,
                            "media_tokens_preexpanded": True})


def test_preexpanded_flag_with_a_bare_marker_is_refused() -> None:
    # catches: silently expanding a prompt the caller said was already expanded
    with pytest.raises(PromptError, match="unexpanded <video>"):
        preparer().prepare({**request("video"), "media_tokens_preexpanded": True})


def test_wrong_video_label_is_refused() -> None:
    # catches: a pre-expanded video whose frame labels are not the ones its frames have (other times)
    later = PROMPTS["video"]["expanded"].replace("sampled at 1.00", "sampled at 1.01")  # tubelet 1's label
    with pytest.raises(PromptError, match="video 0"):
        preparer().prepare({**request("video"), "messages": None, "prompt": later, "media_tokens_preexpanded": True})
    first = PROMPTS["video"]["expanded"].replace("sampled at 0.50", "sampled at 0.51")  # not this video's run now
    with pytest.raises(PromptError, match="more image placeholders"):
        preparer().prepare({**request("video"), "messages": None, "prompt": first, "media_tokens_preexpanded": True})


@pytest.mark.parametrize(("prompt", "match"), [("<image> <image>", "more image placeholders"),
                                               ("no media here", "0 image placeholder"),
                                               ("<image><image> x", "no <img> before it")])
def test_placeholder_count_errors(prompt: str, match: str) -> None:
    # catches: extra or missing placeholders accepted (the engine would splice the wrong features)
    req = {"prompt": prompt, "multi_modal_data": {"image": [REPO / GOLDEN["images"]["tiny_9x13"]["path"]]}}
    with pytest.raises(PromptError, match=match):
        preparer().prepare(req)


def test_video_pruning_refuses_videos_only() -> None:
    # catches: EVS checkpoints served with unpruned video tokens (HF drops a share of them after the merge)
    mcfg = load_config(MODEL)
    mcfg = dataclasses.replace(mcfg, omni=dataclasses.replace(mcfg.omni, video_pruning_rate=0.5))
    evs = PromptPreparer(MODEL, model_config=mcfg)
    with pytest.raises(PromptError, match="video_pruning_rate"):
        evs.prepare(request("video"))
    assert evs.prepare(request("image")).prompt_token_ids == PROMPTS["image"]["input_ids"]


def test_frame_labels() -> None:
    # catches: labels for padding frames, "Frame" for a tubelet's second frame, index/fps times
    assert frame_labels(5, 3, 2, [0.0, 1.5, 3.0, 4.5, 6.0]) == [
        "Frame 1 sampled at 0.00 seconds and frame 2 sampled at 1.50 seconds: ",
        "Frame 3 sampled at 3.00 seconds and frame 4 sampled at 4.50 seconds: ", "Frame 5 sampled at 6.00 seconds: "]
    assert frame_labels(3, 2, 2, None) == ["Frame 1 and frame 2: ", "Frame 3: "]
