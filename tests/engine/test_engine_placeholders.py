"""Placeholder expansion, checking and collapsing; every PromptError; tokenizer return shapes."""

from __future__ import annotations

import pytest
import torch
from engine_cases import CKPT, END, IMAGE, START, VIDEO, media

from mm_infer.prompt.inputs import PromptInput
from mm_infer.prompt.media import MediaDefaults, video_items
from mm_infer.prompt.placeholders import (
    PlaceholderIds,
    PromptError,
    collapse_placeholders,
    expand_placeholders,
)
from mm_infer.prompt.preparer import build_request, render_prompt
from mm_infer.prompt.request import items_from_packed
from mm_infer.prompt.tokenizer import Tokenizer

IDS = PlaceholderIds(IMAGE, VIDEO, START, END)


def run(ids, image=(), video=(), pre=False):
    return expand_placeholders(ids, IDS, image_tokens=list(image), video_tokens=list(video),
                               image_hashes=[f"i{k}" for k in range(len(image))],
                               video_hashes=[f"v{k}" for k in range(len(video))], preexpanded=pre)


def test_expand_records_ranges_in_prompt_order():
    ids = [1, START, VIDEO, END, 2, START, IMAGE, END, START, IMAGE, END]
    out, ranges, order = run(ids, image=[3, 2], video=[4])
    assert out == [1, START, *[VIDEO] * 4, END, 2, START, *[IMAGE] * 3, END, START, IMAGE, IMAGE, END]
    assert [(r.offset, r.length, r.modality, r.content_hash, r.item_index) for r in ranges] == [
        (2, 4, "video", "v0", 0), (9, 3, "image", "i0", 1), (14, 2, "image", "i1", 2)]
    assert order == [("video", 0), ("image", 0), ("image", 1)]
    assert all(all(t == (IMAGE if r.modality == "image" else VIDEO) for t in out[r.offset:r.end]) for r in ranges)


def test_preexpanded_runs_are_checked_never_expanded_twice():
    expanded, _, _ = run([START, IMAGE, END, 5], image=[4])
    again, ranges, _ = run(expanded, image=[4], pre=True)
    assert again == expanded and ranges[0].length == 4
    auto, _, _ = run(expanded, image=[4])  # a full-length run is accepted as is without the flag
    assert auto == expanded


def test_collapse_inverts_expand():
    ids = [7, START, IMAGE, END, START, VIDEO, END, 8]
    out, _, _ = run(ids, image=[6], video=[3])
    assert collapse_placeholders(out, IDS) == ids


@pytest.mark.parametrize("ids, image, video, pre, message", [
    ([START, IMAGE, END], [], [], False, "1 image placeholder(s) but 0 image item(s)"),
    ([1, 2], [4], [], False, "0 image placeholder(s) but 1 image item(s)"),
    ([START, VIDEO, END, START, VIDEO, END], [], [2], False, "2 video placeholder(s) but 1 video item(s)"),
    ([START, IMAGE, IMAGE, IMAGE, END], [4], [], True, "pre-expanded run has 3 tokens, expected 4"),
    ([START, IMAGE, END], [4], [], True, "pre-expanded run has 1 tokens, expected 4"),
    ([START, IMAGE, IMAGE, END], [4], [], False, "run of 2 pad tokens, expected 1 (to expand) or 4"),
    ([IMAGE, END], [4], [], False, "must sit between <|vision_start|> and <|vision_end|>"),
    ([START, IMAGE, 5], [4], [], False, "must sit between"),
])
def test_placeholder_errors(ids, image, video, pre, message):
    with pytest.raises(PromptError, match=message.replace("(", r"\(").replace(")", r"\)").replace("|", r"\|")) as e:
        run(ids, image, video, pre)
    assert e.value.status == 400 and isinstance(e.value, ValueError)


class ShapeTokenizer:
    """encode (the renderer's tokenisation of the templated text) returning each shape transformers 5 may produce."""

    chat_template = "{{ messages }}"

    def __init__(self, shape):
        self.shape = shape

    def apply_chat_template(self, messages, tokenize=False, **kwargs):
        assert not tokenize, "the renderer templates text, then encodes it"
        return "templated"

    def encode(self, text, add_special_tokens=True):
        ids = [1, START, IMAGE, END, 2]
        return {"list": ids, "nested": [ids], "dict": {"input_ids": ids, "attention_mask": [1] * 5},
                "nested_dict": {"input_ids": [ids]}, "tensor": torch.tensor([ids]),
                "tensor_dict": {"input_ids": torch.tensor([ids])}}[self.shape]


@pytest.mark.parametrize("shape", ["list", "nested", "dict", "nested_dict", "tensor", "tensor_dict"])
def test_chat_template_return_shapes(shape):
    assert render_prompt(ShapeTokenizer(shape), messages=[{"role": "user", "content": "x"}]) == [1, START, IMAGE,
                                                                                                 END, 2]


def test_hf_batch_encoding_and_our_tokenizer_agree():
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(CKPT)
    ours = Tokenizer.from_pretrained(CKPT)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it? Ünïcode!"}]},
                {"role": "assistant", "content": "A cat."}, {"role": "user", "content": "Sure?"}]
    assert render_prompt(hf, messages=messages) == render_prompt(ours, messages=messages)
    text = "hello <|image_pad|> world\n  spaces"
    assert render_prompt(hf, prompt=text) == render_prompt(ours, prompt=text)
    ids = render_prompt(ours, prompt=text)
    assert hf.decode(ids, skip_special_tokens=True) == ours.decode(ids, skip_special_tokens=True)


def test_build_request_errors_and_positions():
    tok = Tokenizer.from_pretrained(CKPT)
    with pytest.raises(PromptError, match="exactly one of"):
        build_request(tok, IDS, PromptInput(text="a", token_ids=[1]))
    with pytest.raises(PromptError, match="empty"):
        build_request(tok, IDS, PromptInput(token_ids=[]))
    with pytest.raises(PromptError, match="second_per_grid_ts"):
        defaults = MediaDefaults(None, None, None, None, 2.0)
        video_items(media([(2, 4, 4)], 0), {"second_per_grid_ts": [1.0, 2.0]}, defaults)
    images = items_from_packed("image", media([(1, 4, 6)], 0))
    req = build_request(tok, IDS, PromptInput(token_ids=[5, START, IMAGE, END, 6], images=images))
    assert req.prompt_token_ids == [5, START, *[IMAGE] * 6, END, 6]
    assert req.mrope_positions.shape == (3, 10)
    assert req.mrope_positions[:, -1].tolist() == [6, 6, 6] and req.mrope_delta == 7 - 10  # text resumes at 2 + 3
    assert len(req.items) == 1 and req.items[0].grid_thw == (1, 4, 6) and req.placeholders[0].content_hash
