"""Multi-turn token fidelity: replace_prefix_tokens rules, and a real two-turn conversation over HTTP."""

from __future__ import annotations

import pytest
from server_cases import MEDIA, SMALL, data_url

from mm_infer.prompt import replace_prefix_tokens
from mm_infer.prompt.placeholders import PromptError

IMAGE_PAD, EOS = 3006, 3002


class Eos2:
    eos_token_id = 2


def test_splice_example_from_the_issue():
    out = replace_prefix_tokens(Eos2(), [11, 12, 13, 40, 41, 220, 17, 2], [11, 12, 13, 40, 41, 1001, 2],
                                [11, 12, 13, 40, 41, 1001, 2, 21, 22, 40, 41])
    assert out == [11, 12, 13, 40, 41, 220, 17, 2, 21, 22, 40, 41]


def test_splice_counts_eos_over_several_turns():
    model = [5, 2, 6, 7, 2, 8, 9, 2]  # three closed turns; the model's last turn was 8 9
    template_prefix = [5, 2, 6, 7, 2, 8, 1, 2, 99]
    template = [5, 2, 6, 7, 2, 8, 1, 2, 99, 30, 31]
    assert replace_prefix_tokens(Eos2(), model, template_prefix, template) == [5, 2, 6, 7, 2, 8, 9, 2, 99, 30, 31]


def test_truncated_turn_is_closed_by_the_template_eos():
    assert replace_prefix_tokens(Eos2(), [11, 12, 40, 41], [11, 12, 1001, 2], [11, 12, 1001, 2, 21]) == \
        [11, 12, 40, 41, 2, 21]


def test_empty_model_prefix_returns_the_template():
    assert replace_prefix_tokens(Eos2(), [], [1, 2], [1, 2, 3]) == [1, 2, 3]


@pytest.mark.parametrize("model, prefix, template", [
    ([1, 2, 3], [1, 3], [1, 3, 4]),  # no EOS in the template prefix
    ([1, 2, 3], [1, 2, 2], [1, 2, 5]),  # template has fewer EOS than its prefix
    ([1, 3], [1, 2, 3, 2], [1, 2, 3, 2, 5]),  # model closed 0 turns, template 2
])
def test_impossible_splices_raise(model, prefix, template):
    with pytest.raises(PromptError, match="cannot splice"):
        replace_prefix_tokens(Eos2(), model, prefix, template)


def test_two_turn_conversation_keeps_first_turn_ids(client):
    photo = data_url(MEDIA / "images" / "photo.png", "image/png")
    gray = data_url(MEDIA / "images" / "gray.png", "image/png")
    turn1 = [{"type": "image_url", "image_url": {"url": photo}}, {"type": "text", "text": "Describe it."}]
    # min_tokens holds EOS back for three tokens, then the bias makes the model close its turn with EOS
    extra = {"return_token_ids": True, "min_tokens": 3, "mm_processor_kwargs": {"max_pixels": SMALL}}
    first = client.chat.completions.create(model="m", messages=[{"role": "user", "content": turn1}], max_tokens=8,
                                           temperature=0.0, logit_bias={str(EOS): 100}, extra_body=extra)
    p1 = first.model_extra["prompt_token_ids"]
    g1 = first.choices[0].model_extra["token_ids"]
    assert g1[-1] == EOS and len(g1) == 4 and first.choices[0].finish_reason == "stop"
    messages = [{"role": "user", "content": turn1},
                {"role": "assistant", "content": first.choices[0].message.content,
                 "prompt_token_ids": p1, "generation_token_ids": g1},
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": gray}},
                                             {"type": "text", "text": "And this?"}]}]
    second = client.chat.completions.create(model="m", messages=messages, max_tokens=2, temperature=0.0,
                                            extra_body={"return_token_ids": True,
                                                        "mm_processor_kwargs": {"max_pixels": SMALL}})
    p2 = second.model_extra["prompt_token_ids"]
    assert p2[:len(p1) + len(g1)] == p1 + g1, "the second prompt must start with the first turn's exact ids"
    first_image = p1.count(IMAGE_PAD)
    runs = [i for i in range(1, len(p2)) if p2[i] == IMAGE_PAD and p2[i - 1] != IMAGE_PAD]
    assert len(runs) == 2 and p2[runs[0]:].index(3004) == first_image  # the first image is not expanded twice
    assert p2.count(IMAGE_PAD) > first_image + 1  # the new image is expanded
