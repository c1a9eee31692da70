"""The library's chat prompt (mm_infer/prompt/chat_prompt.py): render, splice a carried turn, truncate safely."""

from __future__ import annotations

import pytest
from server_cases import CKPT

from mm_infer.prompt.chat_prompt import CarriedTurn, ChatPrompt, TemplateOptions, chat_token_ids, truncate_prompt
from mm_infer.prompt.inputs import PromptInput
from mm_infer.prompt.placeholders import PromptError
from mm_infer.prompt.preparer import PromptPreparer

CONVO = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour?"}]},
         {"role": "assistant", "content": "red"}, {"role": "user", "content": "Are you sure?"}]


@pytest.fixture(scope="module")
def preparer() -> PromptPreparer:
    return PromptPreparer(str(CKPT))


def test_without_a_carried_turn_the_ids_are_the_rendered_template(preparer):
    renderer = preparer.renderer
    assert chat_token_ids(ChatPrompt(CONVO), renderer) == renderer.render(CONVO)
    closed = TemplateOptions(add_generation_prompt=False)
    assert chat_token_ids(ChatPrompt(CONVO, closed), renderer) == renderer.render(CONVO, add_generation_prompt=False)


def test_a_carried_turn_keeps_its_exact_ids_and_the_rest_is_the_template(preparer):
    # catches: a splice that re-tokenises the earlier turn (its sampled ids differ from a fresh tokenisation),
    # or that renders the prefix with a generation prompt
    renderer = preparer.renderer
    prefix = renderer.render(CONVO[:2], add_generation_prompt=False)
    eos = preparer.tokenizer.eos_token_id
    last = len(prefix) - 1 - prefix[::-1].index(eos)  # the EOS that closes the assistant turn
    sampled = [*prefix[:last], 7, 8, 9, eos]  # the model's own ids: more than a fresh tokenisation of "red"
    whole = renderer.render(CONVO)
    got = chat_token_ids(ChatPrompt(CONVO, carried=CarriedTurn(1, sampled)), renderer)
    assert got[:len(sampled)] == sampled and got[len(sampled):] == whole[last + 1:]
    assert got != whole


def test_the_offline_path_renders_through_the_same_function(preparer):
    request = preparer.prepare({"messages": CONVO[:1], "multi_modal_data": {"image": [
        str(CKPT.parents[1] / "media" / "shapes" / "colour_example.png")]}})
    raw = chat_token_ids(ChatPrompt(CONVO[:1]), preparer.renderer)
    pad = preparer.placeholder_ids.image_pad_id
    assert [t for t in request.prompt_token_ids if t != pad] == [t for t in raw if t != pad]


def test_truncation_keeps_the_tail_and_never_cuts_a_media_run(preparer):
    ids = preparer.placeholder_ids
    tokens = [1, 2, 3, 4, ids.vision_start_id, ids.image_pad_id, ids.vision_end_id, 5, 6]
    item = preparer.prepare({"messages": CONVO[:1], "multi_modal_data": {"image": [
        str(CKPT.parents[1] / "media" / "shapes" / "colour_example.png")]}}).items[0]
    prompt = PromptInput(token_ids=tokens, images=[item])
    expanded = len(tokens) - 1 + item.num_tokens(preparer.merge_size)
    assert truncate_prompt(prompt, None, ids, preparer.merge_size) is prompt
    assert truncate_prompt(prompt, expanded - 2, ids, preparer.merge_size).token_ids == tokens[2:]
    with pytest.raises(PromptError, match="would cut the image placeholder run") as err:
        truncate_prompt(prompt, expanded - 5, ids, preparer.merge_size)
    assert err.value.param == "truncate_prompt_tokens"
