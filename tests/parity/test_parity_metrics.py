"""scripts/peers/parity.py's metrics on hand-made replies: divergence, logprob errors, aggregation, notes, summary."""

from __future__ import annotations

import math
from types import ModuleType

import pytest


def test_divergence_and_logprob_errors_cover_only_the_agreeing_prefix(parity: ModuleType) -> None:
    a = parity.Reply(text="x", prompt_ids=[1, 2], gen_ids=[5, 6, 7, 8], logprobs=[-0.1, -0.2, -0.3, -9.0])
    b = parity.Reply(text="y", prompt_ids=[1, 2], gen_ids=[5, 6, 9], logprobs=[-0.1, -0.25, -5.0])
    m = parity.compare(a, b)
    assert m["compare"] == "ids" and m["exact_match"] is False and m["prompt_ids_match"] is True
    assert m["first_divergence"] == 2 and m["agreeing_tokens"] == 2
    assert m["max_dlogprob"] == pytest.approx(0.05)
    assert m["token_mult_prob_error"] == pytest.approx((1.0 + math.exp(0.05)) / 2)


def test_a_shorter_equal_prefix_diverges_at_its_end(parity: ModuleType) -> None:
    assert parity.first_divergence([1, 2], [1, 2, 3]) == 2
    assert parity.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert parity.first_divergence([4], [1]) == 0


def test_text_mode_uses_token_strings_then_characters(parity: ModuleType) -> None:
    a = parity.Reply(text="ab c", gen_ids=[1, 2], logprobs=[-1.0, -2.0], tokens=["ab", " c"])
    b = parity.Reply(text="ab d", logprobs=[-1.0, -2.5], tokens=["ab", " d"])
    m = parity.compare(a, b)
    assert (m["compare"], m["divergence_unit"], m["first_divergence"], m["exact_match"]) == ("text", "token_str", 1,
                                                                                              False)
    assert m["prompt_ids_match"] is None and m["agreeing_tokens"] == 1 and m["max_dlogprob"] == 0.0
    bare = parity.compare(parity.Reply(text="ab c"), parity.Reply(text="ab d"))
    assert (bare["divergence_unit"], bare["first_divergence"]) == ("char", 3) and "max_dlogprob" not in bare


def _record(metrics: list[dict], a_ids: bool = True) -> dict:
    reply = {"gen_ids": [1] if a_ids else None, "prompt_ids": [1], "logprobs": [0.0]}
    return {"name": "c", "suite": "image", "turns": [{"a": reply, "b": reply, "metrics": m} for m in metrics]}


def test_aggregate_pools_agreeing_tokens(parity: ModuleType) -> None:
    one = parity.compare(parity.Reply(gen_ids=[1, 2], prompt_ids=[0], logprobs=[0.0, -0.1]),
                         parity.Reply(gen_ids=[1, 2], prompt_ids=[0], logprobs=[0.0, -0.3]))
    two = parity.compare(parity.Reply(gen_ids=[3], prompt_ids=[0], logprobs=[-1.0]),
                         parity.Reply(gen_ids=[4], prompt_ids=[9], logprobs=[-1.0]))
    agg = parity.aggregate([_record([one, two])])
    assert agg["turns"] == 2 and agg["exact_match"] == 0.5 and agg["prompt_ids_match"] == 0.5
    assert agg["agreeing_tokens"] == 2 and agg["max_dlogprob"] == pytest.approx(0.2)
    assert agg["token_mult_prob_error"] == pytest.approx((1.0 + math.exp(0.2)) / 2)
    line = parity.summary_line(agg, parity.notes_for([_record([one, two])]))
    assert line == ("compare=ids turns=2 errors=0 prompt_ids_match=0.50 exact_match=0.50 max_dlogprob=2.0e-01 "
                    f"token_mult_prob_error={(1.0 + math.exp(0.2)) / 2:.6f}")


def test_suite_is_fixed_for_a_seed(parity: ModuleType) -> None:
    first, again, other = (parity.build_suite(["image", "video", "multiturn"], seed) for seed in (0, 0, 1))
    assert [c.name for c in first] == [c.name for c in again]
    assert [c.turns for c in first] == [c.turns for c in again] and [c.turns for c in first] != [c.turns for c in other]
    assert {c.suite for c in first} == {"image", "video", "multiturn"}
    assert [len(c.turns) for c in first if c.suite == "multiturn"] == [2]


def test_cli_needs_exactly_one_side_b(parity: ModuleType) -> None:
    with pytest.raises(SystemExit):
        parity.parse_args(["--a", "http://x"])
    with pytest.raises(SystemExit):
        parity.parse_args(["--a", "http://x", "--b", "http://y", "--suite", "audio"])


def test_codecs_suite_has_one_case_per_parity_video(parity: ModuleType) -> None:
    from mm_infer.data.parity_suite import CODEC_VIDEOS

    cases = parity.build_suite(["codecs"])
    assert [c.name for c in cases] == [f"codec-{p.name}" for p in sorted(CODEC_VIDEOS.iterdir())]
    urls = [c.turns[0][0]["video_url"]["url"] for c in cases]
    assert {u.split(";")[0] for u in urls} == {"data:video/mp4", "data:video/webm", "data:video/x-msvideo"}
    assert "codecs" not in {c.suite for c in parity.build_suite(list(parity.DEFAULT_SUITES))}
