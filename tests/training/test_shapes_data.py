"""The synthetic shapes data: seeded, well-formed, labelled only on answers, and lossless as a video data URL."""

from pathlib import Path

import numpy as np
import torch

from mm_infer.data import TASKS, ChatEncoder, make_sample
from mm_infer.data.batching import collate
from mm_infer.data.chat import IGNORE
from mm_infer.data.media_urls import video_bytes
from mm_infer.data.shapes import COLOURS, SHAPES
from mm_infer.data.tasks import DIRECTIONS, MAX_COUNT
from mm_infer.media import preprocess_videos

CKPT = Path(__file__).resolve().parents[2] / "assets" / "models" / "tiny-qwen2-vl"  # same tokenizer and configs

VALID = {"colour": set(COLOURS), "shape": set(SHAPES), "count": {str(n) for n in range(1, MAX_COUNT + 1)},
         "direction": set(DIRECTIONS)}


def test_samples_are_seeded_and_answers_valid():
    for task in TASKS:
        a, b, c = make_sample(0, 5, task), make_sample(0, 5, task), make_sample(1, 5, task)
        assert a.answer == b.answer and np.array_equal(a.media, b.media)
        assert not np.array_equal(a.media, c.media)
        answers = {make_sample(3, i, task).answer for i in range(40)}
        assert answers == VALID[task], (task, answers)
        assert a.media.dtype == np.uint8 and a.media.shape[-1] == 3
        assert a.media.ndim == (4 if task == "direction" else 3)


def test_collate_labels_only_answers_and_marks_media_tokens():
    enc = ChatEncoder.from_dir(CKPT)
    examples = [enc.encode(make_sample(0, 0, "count")), enc.encode(make_sample(0, 0, "direction"))]
    batch = collate(examples, enc.tokenizer.pad_token_id)
    for row, ex in enumerate(examples):
        labels = batch["labels"][row]
        kept = labels[labels != IGNORE].tolist()
        assert kept == ex.answer_ids and kept[-1] == enc.end_id
        assert enc.decode_answer(kept) == make_sample(0, 0, "direction" if ex.modality == "video" else "count").answer
        n_media = ex.media.tokens_per_item()[0]
        assert int((batch["mm_token_type_ids"][row] == (2 if ex.modality == "video" else 1)).sum()) == n_media
    assert batch["pixel_values"].shape[0] == int(batch["image_grid_thw"].prod(-1).sum())
    assert batch["video_grid_thw"].tolist() == [[2, 8, 8]]


def test_video_data_url_bytes_decode_to_the_same_pixels():
    sample = make_sample(0, 1, "direction")
    frames, _ = preprocess_videos([sample.media], fps=2.0, min_pixels=3136, max_pixels=100352)
    for decoder in ("auto", "pyav"):
        packed, meta = preprocess_videos([video_bytes(sample.media)], fps=2.0, min_pixels=3136, max_pixels=100352,
                                         decoder=decoder)
        assert meta[0].frame_indices == list(range(len(sample.media)))
        assert torch.equal(packed.pixel_values, frames.pixel_values)
