"""smart_resize against an independent exact-arithmetic formula, and its rounding edge cases."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mm_infer.media import MediaInvalidError, smart_resize


def reference_resize(h: int, w: int, f: int, lo: int, hi: int) -> tuple[int, int]:
    """The same rule written with exact rationals (round half to even on exact values)."""
    hb, wb = round(Fraction(h, f)) * f, round(Fraction(w, f)) * f
    if hb * wb > hi:
        beta = math.sqrt(h * w / hi)
        return max(f, math.floor(h / beta / f) * f), max(f, math.floor(w / beta / f) * f)
    if hb * wb < lo:
        beta = math.sqrt(lo / (h * w))
        return math.ceil(h * beta / f) * f, math.ceil(w * beta / f) * f
    return hb, wb


sizes = st.integers(min_value=1, max_value=6000)


@settings(max_examples=400, deadline=None)
@given(h=sizes, w=sizes, lo=st.sampled_from([3136, 56 * 56 * 4, 100352]),
       hi=st.sampled_from([100352, 200704, 1003520, 12845056]))
def test_matches_exact_formula_and_invariants(h: int, w: int, lo: int, hi: int) -> None:
    if max(h, w) / min(h, w) > 200:
        with pytest.raises(MediaInvalidError, match="aspect ratio"):
            smart_resize(h, w, 28, lo, hi)
        return
    rh, rw = smart_resize(h, w, 28, lo, hi)
    assert (rh, rw) == reference_resize(h, w, 28, lo, hi)
    assert rh % 28 == 0 and rw % 28 == 0 and rh >= 28 and rw >= 28
    if rh > 28 and rw > 28:
        assert rh * rw <= max(hi, lo * 4)


def test_half_patch_rounds_to_even() -> None:
    # 42 / 28 = 1.5 rounds to 2 and 126 / 28 = 4.5 rounds to 4 (half to even), as the reference does.
    assert smart_resize(42, 126, 28, 3136, 200704) == (56, 112)
    assert smart_resize(70, 28 * 3, 28, 28 * 28, 10**7) == (56, 84)  # 2.5 -> 2


def test_extreme_aspect_ratio_is_refused_with_the_ratio() -> None:
    with pytest.raises(MediaInvalidError, match=r"201\.0"):
        smart_resize(1, 201)
