"""Inline render features: uint8 frames travel (a quarter of the bytes of rows); the older rows payload decodes."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import torch

from mm_infer.media import preprocess_images
from mm_infer.prompt.request import MediaItem, items_from_packed
from servers.openai.media.features import decode_item, encode_item

IMAGE = Path(__file__).resolve().parents[2] / "assets" / "media" / "shapes" / "colour_example.png"


def _item() -> MediaItem:
    return items_from_packed("image", preprocess_images([IMAGE], max_pixels=200704))[0]


def test_frames_payload_round_trips_bit_for_bit_at_a_quarter_of_the_bytes():
    item = _item()
    data = encode_item(item)
    head = json.loads(base64.b64decode(data).split(b"\n", 1)[0])
    assert head["form"] == "frames" and head["dtype"] == "uint8"
    back = decode_item(data, "image", "here")
    assert back.frames is not None and back.grid_thw == item.grid_thw
    assert torch.equal(back.pixel_values, item.pixel_values)
    rows_data = encode_item(MediaItem("image", item.pixel_values, item.grid_thw, item.content_hash))
    assert len(data) * 7 < len(rows_data), "uint8 frames vs float32 rows over the temporal patch"


def test_the_older_rows_payload_is_still_accepted():
    item = _item()
    rows = MediaItem("image", item.pixel_values, item.grid_thw, item.content_hash)
    data = encode_item(rows)
    assert "form" not in json.loads(base64.b64decode(data).split(b"\n", 1)[0])
    back = decode_item(data, "image", "here")
    assert back.frames is None and torch.equal(back.pixel_values, item.pixel_values)
    assert back.content_hash != decode_item(encode_item(item), "image", "here").content_hash  # keyed by own bytes
