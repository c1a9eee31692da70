"""Nemotron Omni audio in prompts: multi_modal_data["audio"] -> feature items, each <so_embedding> expanded as HF
5.24's Omni processor expands it (its ids compared on the same rendered text), ranges in prompt order beside images,
pre-expanded runs checked token for token, and every refusal a 400 naming the item or the model."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
import pytest
import torch

from mm_infer.media.errors import MediaError
from mm_infer.media.omni_audio import AudioFeatureSpec, audio_features, decode_audio, token_count
from mm_infer.prompt.inputs import PromptInput
from mm_infer.prompt.placeholders import PromptError
from mm_infer.prompt.preparer import PromptPreparer
from tests.media.test_omni_audio_features import sweep, wav_bytes

MODELS = Path(__file__).resolve().parents[2] / "assets" / "models"
CKPT = MODELS / "tiny-nemotron-omni-audio"
pytestmark = pytest.mark.skipif(not CKPT.exists(), reason=f"{CKPT.name} (the lead's audio checkpoint) is not built")
SPEC = AudioFeatureSpec()  # the checkpoint's processor_config.json: ParakeetFeatureExtractor's defaults
LONG, SHORT = 16037, 10245  # 101 and 65 mel frames: 13 and 9 tokens


@cache
def preparer() -> PromptPreparer:
    return PromptPreparer(CKPT)


@cache
def clip(n: int) -> bytes:
    return wav_bytes(sweep(n))


def ids_of(*tokens: str) -> list[int]:
    return [int(preparer().tokenizer.convert_tokens_to_ids(t)) for t in tokens]


def audio_chat(*parts: str) -> list[dict]:
    """One user message; "audio" / "image" name media parts, anything else is a text part."""
    content = [{"type": p} if p in ("audio", "image") else {"type": "text", "text": p} for p in parts]
    return [{"role": "user", "content": content}]


@cache
def hf_processor():
    from transformers import AutoTokenizer, ParakeetFeatureExtractor
    from transformers.models.nemotron_h_omni.processing_nemotron_h_omni import (
        NemotronH_Omni_Reasoning_V3Processor as Processor,
    )

    class AudioOnly(Processor):  # its image and video processors need torchvision; audio never touches them
        def check_argument_for_proper_class(self, argument_name, argument):
            return type(argument)

    return AudioOnly(image_processor=None, video_processor=None, tokenizer=AutoTokenizer.from_pretrained(CKPT),
                     feature_extractor=ParakeetFeatureExtractor(feature_size=80))


def hf_ids(text: str, waves: list[torch.Tensor]) -> tuple[list[int], torch.Tensor]:
    out = hf_processor()(text=[text], audio=[w.numpy() for w in waves], return_tensors="pt")
    return out["input_ids"][0].tolist(), out["input_features"]


def test_the_spec_is_read_from_the_checkpoint_processor_config():
    # catches: the audio settings taken from preprocessor_config.json (the image processor's) or left unset
    assert preparer().media_defaults.audio == SPEC


def test_two_clips_expand_as_hf_processor_expands_them():
    # catches: a run one token off HF's count rule, <so_start>/<so_end> missing, clips swapped, ranges off by one
    waves = [decode_audio(clip(LONG)), decode_audio(clip(SHORT))]
    msgs = audio_chat("audio", "first", "audio", "second")
    req = preparer().prepare({"messages": msgs, "multi_modal_data": {"audio": [clip(LONG), clip(SHORT)]}})
    text = preparer().renderer.render_text(msgs)
    assert text.count("<so_embedding>") == 2
    want, feats = hf_ids(text, waves)
    assert req.prompt_token_ids == want
    start, emb, end = ids_of("<so_start>", "<so_embedding>", "<so_end>")
    assert [(r.modality, r.length, r.item_index, r.item_offset) for r in req.placeholders] == [
        ("audio", 13, 0, 0), ("audio", 9, 1, 0)]
    for r in req.placeholders:
        assert req.prompt_token_ids[r.offset - 1] == start and req.prompt_token_ids[r.end] == end
        assert set(req.prompt_token_ids[r.offset:r.end]) == {emb}
    for k, (item, n) in enumerate(zip(req.items, (LONG, SHORT), strict=True)):
        frames = 1 + n // 160
        assert (item.modality, item.grid_thw, item.tokens) == ("audio", (1, frames, 1), token_count(n, SPEC))
        assert torch.equal(item.pixel_values, feats[k, :frames])  # HF's features, the padding cut off


def test_audio_and_image_items_keep_prompt_order():
    # catches: audio items appended after all images (the model would put clip features in image slots)
    from PIL import Image

    image = Image.fromarray(np.arange(64 * 64 * 3, dtype=np.uint8).reshape(64, 64, 3))
    req = preparer().prepare({"messages": audio_chat("audio", "image", "audio", "look and listen"),
                              "multi_modal_data": {"audio": [clip(LONG), clip(SHORT)], "image": [image]}})
    assert [it.modality for it in req.items] == ["audio", "image", "audio"]
    assert [r.item_index for r in req.placeholders] == [0, 1, 2]
    assert [r.modality for r in req.placeholders] == ["audio", "image", "audio"]
    assert req.placeholders[0].end < req.placeholders[1].offset < req.placeholders[2].offset


@pytest.mark.parametrize("form", ["bytes", "path", "array", "tensor", "pair"])
def test_every_source_form_gives_the_same_item(form, tmp_path):
    # catches: a path read as text, a waveform not float32, a (waveform, rate) pair taken as two clips
    wave = decode_audio(clip(LONG))
    path = tmp_path / "a.wav"
    path.write_bytes(clip(LONG))
    source = {"bytes": clip(LONG), "path": str(path), "array": wave.numpy().astype(np.float64), "tensor": wave,
              "pair": (wave.numpy(), 16000)}[form]
    item = preparer().parse({"prompt": "<so_embedding>", "multi_modal_data": {"audio": source}}).audios
    assert len(item) == 1
    assert torch.equal(item[0].pixel_values, audio_features(wave, SPEC)[0])


def test_a_pair_at_another_rate_is_resampled_to_16k():
    # catches: an 8 kHz waveform counted as 16 kHz samples (half the tokens HF gives the resampled clip)
    wave = decode_audio(clip(LONG)).numpy()[::2].copy()
    item = preparer().parse({"prompt": "x", "multi_modal_data": {"audio": [(wave, 8000)]}}).audios[0]
    assert item.tokens == token_count(2 * wave.shape[0], SPEC)


def test_content_hash_follows_the_audio():
    # catches: one hash for every clip (a prefix-cache hit would reuse another clip's KV)
    parse = preparer().parse
    a, b, a2 = (parse({"prompt": "x", "multi_modal_data": {"audio": [c]}}).audios[0]
                for c in (clip(LONG), clip(SHORT), clip(LONG)))
    assert a.content_hash == a2.content_hash != b.content_hash
    wave = decode_audio(clip(LONG)).numpy()
    w1 = parse({"prompt": "x", "multi_modal_data": {"audio": [wave]}}).audios[0]
    w2 = parse({"prompt": "x", "multi_modal_data": {"audio": [(wave, 16000)]}}).audios[0]
    assert w1.content_hash == w2.content_hash != a.content_hash


def test_preexpanded_hf_ids_are_taken_as_they_are():
    # catches: a pre-expanded run expanded again, or its range not recorded
    text = "hear <so_embedding> now"
    want, _ = hf_ids(text, [decode_audio(clip(LONG))])
    for pre in (True, False):
        req = preparer().prepare({"prompt_token_ids": want, "multi_modal_data": {"audio": [clip(LONG)]},
                                  "media_tokens_preexpanded": pre})
        assert req.prompt_token_ids == want
        assert [(r.offset, r.length) for r in req.placeholders] == [(want.index(ids_of("<so_embedding>")[0]), 13)]


def test_a_preexpanded_run_of_the_wrong_length_names_the_item():
    # catches: a short run accepted (features and slots would disagree in the model)
    want, _ = hf_ids("<so_embedding>", [decode_audio(clip(SHORT))])  # 9 tokens for a 13-token clip
    with pytest.raises(PromptError, match=r"audio 0: the expanded run .* \(<so_start>, 13 <so_embedding>"):
        preparer().prepare({"prompt_token_ids": want, "multi_modal_data": {"audio": [clip(LONG)]},
                            "media_tokens_preexpanded": True})


def test_preexpanded_with_a_bare_marker_is_an_error():
    # catches: media_tokens_preexpanded silently expanding a marker
    with pytest.raises(PromptError, match="audio 0: media_tokens_preexpanded is set, but .* unexpanded <so_embedding>"):
        preparer().prepare({"prompt": "a <so_embedding>", "multi_modal_data": {"audio": [clip(LONG)]},
                            "media_tokens_preexpanded": True})


def test_a_run_without_so_start_is_an_error():
    # catches: a bare run of <so_embedding> read as several markers
    ids = [*ids_of("<so_embedding>") * 13, *ids_of("<so_end>")]
    with pytest.raises(PromptError, match="no <so_start> before it"):
        preparer().prepare({"prompt_token_ids": ids, "multi_modal_data": {"audio": [clip(LONG)]}})


@pytest.mark.parametrize(("markers", "clips", "message"), [
    (2, 1, "more audio placeholders than the 1 audio item"),
    (1, 2, "prompt has 1 audio placeholder.* but 2 audio item"),
    (0, 1, "prompt has 0 audio placeholder.* but 1 audio item"),
])
def test_marker_and_item_counts_must_agree(markers, clips, message):
    # catches: a clip dropped silently, or a marker left as a text token
    with pytest.raises(PromptError, match=message):
        preparer().prepare({"prompt": "x" + " <so_embedding>" * markers,
                            "multi_modal_data": {"audio": [clip(LONG)] * clips}})


def test_undecodable_and_too_short_audio_name_the_item():
    # catches: a bare decoder message without the item, or a NaN feature row from a two-sample clip
    with pytest.raises(MediaError, match="audio 1: undecodable audio") as bad:
        preparer().parse({"prompt": "x", "multi_modal_data": {"audio": [clip(LONG), b"not audio at all"]}})
    assert bad.value.status == 400
    with pytest.raises(MediaError, match="audio 0: audio of 100 samples is shorter than 2 mel frames") as short:
        preparer().parse({"prompt": "x", "multi_modal_data": {"audio": [np.zeros(100, np.float32)]}})
    assert short.value.status == 400


@pytest.mark.parametrize("source", [np.zeros((2, 3, 4000), np.float32), 42, {"a": 1}],
                         ids=["3-d array", "int", "dict"])
def test_a_bad_source_is_a_400(source):
    # catches: a multichannel block averaged into nonsense, or a TypeError leaking as a 500
    with pytest.raises(MediaError, match="audio 0: ") as err:
        preparer().parse({"prompt": "x", "multi_modal_data": {"audio": [source]}})
    assert err.value.status == 400


@pytest.mark.parametrize("model", ["tiny-nemotron-omni", "tiny-qwen2-vl"])
def test_audio_on_a_model_without_an_audio_tower_names_the_model(model):
    # catches: audio dropped silently on a model that cannot hear it
    other = PromptPreparer(MODELS / model)
    with pytest.raises(PromptError, match=f"{model} has no audio tower"):
        other.prepare({"prompt": "x", "multi_modal_data": {"audio": [clip(LONG)]}})
    items = preparer().parse({"prompt": "x", "multi_modal_data": {"audio": [clip(LONG)]}}).audios
    with pytest.raises(PromptError, match=f"{model} .* has no audio tower"):
        other.prepare(PromptInput(text="x", audios=items))


def test_without_audio_tower_so_embedding_is_plain_text():
    # catches: the marker treated as a placeholder on an Omni model without an audio tower (HF leaves it)
    other = PromptPreparer(MODELS / "tiny-nemotron-omni")
    ids = other.prepare({"prompt": "x <so_embedding>"}).prompt_token_ids
    assert ids == other.tokenizer.encode("x <so_embedding>", add_special_tokens=False)


def test_unknown_multi_modal_data_key_names_the_accepted_ones():
    with pytest.raises(PromptError, match="expected image, video and/or audio"):
        preparer().parse({"prompt": "x", "multi_modal_data": {"sound": [clip(LONG)]}})
