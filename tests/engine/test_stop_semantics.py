"""vLLM's stop semantics, token by token on a toy vocabulary: stop-token text, min_tokens and stop strings, EOS ids."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mm_infer import SamplingParams
from mm_infer.engine.outputs.detokenizer import IncrementalDetokenizer
from mm_infer.engine.outputs.request_output import RequestOutput, make_output
from mm_infer.engine.outputs.stopping import apply_stop_rules
from mm_infer.engine.sampling.params import RequestOutputKind
from mm_infer.engine.scheduling.sequence import Sequence, SequenceGroup, SequenceStatus

EOS, EOS2, UN, EXAMPLE = 0, 1, 8, 10
VOCAB = {EOS: "<eos>", EOS2: "<eos2>", 2: "a", 3: "b", 4: " ", 5: "ex", 6: "ample", 7: "m", UN: "Un", 9: "?",
         EXAMPLE: "example", 11: "ab"}
SPECIAL = {EOS, EOS2}
EOS_IDS = (EOS, EOS2)  # primary first, then the generation config's other EOS


def decode(ids: list[int], skip_special_tokens: bool) -> str:
    return "".join(VOCAB[i] for i in ids if not (skip_special_tokens and i in SPECIAL))


def run(tokens: list[int], kind: RequestOutputKind, eos_ids=EOS_IDS, **kw) -> tuple[list[RequestOutput], Sequence]:
    """Feed `tokens` one per step as the engine does (append, push text, check stops); each step's output."""
    params = SamplingParams(output_kind=kind, max_tokens=kw.pop("max_tokens", len(tokens)), **kw)
    request = SimpleNamespace(placeholders=[], item_patches=[], prompt_text=None, prompt_token_ids=[9])
    group = SequenceGroup("r", params, request)
    seq = Sequence(group, [9])
    group.seqs = [seq]
    seq.detok = IncrementalDetokenizer(decode, params.skip_special_tokens, seq.num_prompt_tokens)
    outs = []
    for token in tokens:
        seq.token_ids.append(token)
        seq.logprobs.append(-0.5)
        seq.last_text_chars = len(seq.detok.push(seq.token_ids))
        stop = apply_stop_rules(seq, token, eos_ids, params.max_tokens)
        if stop is not None:
            seq.stop_reason, seq.finish_reason, seq.status = stop[1], stop[0], SequenceStatus.FINISHED
        outs.append(make_output(group, decode))
        if stop is not None:
            break
    return outs, seq


def final(tokens: list[int], **kw) -> tuple[str, list[int], str | None, int | str | None]:
    """(text, ids, finish_reason, stop_reason) of the cumulative run; the streamed (DELTA) run must agree."""
    outs, _ = run(tokens, RequestOutputKind.CUMULATIVE, **kw)
    last = outs[-1].outputs[0]
    deltas, _ = run(tokens, RequestOutputKind.DELTA, **kw)
    assert "".join(o.outputs[0].text for o in deltas) == last.text
    assert [t for o in deltas for t in o.outputs[0].token_ids] == last.token_ids
    assert deltas[-1].outputs[0].stop_reason == last.stop_reason
    return last.text, last.token_ids, last.finish_reason, last.stop_reason


def test_stop_token_id_text_is_not_output():
    # catches (issue 34.4): the stop token's text stayed in the output ('…messageUn' against vLLM's '…message')
    assert final([7, 4, EXAMPLE, UN, 2], stop_token_ids=[UN]) == ("m example", [7, 4, EXAMPLE, UN], "stop", UN)
    kept = final([7, 4, EXAMPLE, UN, 2], stop_token_ids=[UN], include_stop_str_in_output=True)
    assert kept == ("m exampleUn", [7, 4, EXAMPLE, UN], "stop", UN)
    # the stop string hold-back does not change it: the text before the stop token is whole
    assert final([7, 4, EXAMPLE, UN], stop_token_ids=[UN], stop=["zzzz"])[0] == "m example"


@pytest.mark.parametrize("skip", [True, False])
def test_eos_text_is_not_output(skip):
    # catches: with skip_special_tokens=False the EOS text ended the output (vLLM leaves it out, the id stays)
    assert final([7, 4, EOS], skip_special_tokens=skip) == ("m ", [7, 4, EOS], "stop", None)
    kept = final([7, 4, EOS], skip_special_tokens=skip, include_stop_str_in_output=True)
    assert kept[0] == ("m " if skip else "m <eos>")
    # a length finish on an ignored EOS is not a stop: its text stays
    assert final([7, EOS, 4], skip_special_tokens=skip, ignore_eos=True)[0] == ("m " if skip else "m<eos> ")


def test_second_eos_reports_its_id():
    # catches (issue 34.16): the generation config's second EOS ended with stop_reason None; vLLM reports the id
    assert final([7, EOS2, 2]) == ("m", [7, EOS2], "stop", EOS2)
    assert final([7, EOS, 2]) == ("m", [7, EOS], "stop", None)
    assert final([7, EOS2, EOS, 2], ignore_eos=True, max_tokens=3)[2:] == ("length", None)
    assert final([7, EOS2, 2], stop_token_ids=[EOS2], ignore_eos=True)[2:] == ("stop", EOS2)  # asked for: stops


def test_stop_string_within_min_tokens_does_not_stop():
    # catches (issue 34.5): a stop string generated before min_tokens ended the request, cut below min_tokens
    tokens = [7, 4, EXAMPLE, 4, 2, 4, EXAMPLE, 3]  # "m example a example b"
    assert final(tokens, stop=["example"], min_tokens=3) == ("m example a ", tokens[:7], "stop", "example")
    assert final(tokens, stop=["example"], min_tokens=2) == ("m ", tokens[:3], "stop", "example")
    assert final(tokens, stop=["example"], min_tokens=7)[2:] == ("length", None)
    kept = final(tokens, stop=["example"], min_tokens=3, include_stop_str_in_output=True)
    assert kept[:2] == ("m example a example", tokens[:7])


def test_stop_string_may_begin_within_min_tokens():
    # vLLM: the stop string must end after the min_tokens-th token's text; it may begin before it
    tokens = [7, 4, 5, 6, 2]  # "m " + "ex" + "ample"
    assert final(tokens, stop=["example"], min_tokens=3) == ("m ", tokens[:4], "stop", "example")
    # a short stop string wholly inside the min_tokens text is not found later through a longer one's window
    assert final([11, 9, 9, 9], stop=["ab", "abcdefg"], min_tokens=1)[2:] == ("length", None)


def test_first_stop_string_in_request_order_wins():
    # vLLM's check_stop_strings returns the first stop string (in the request's order) found in the new text
    assert final([9, 11, 2], stop=["b", "ab"])[::3] == ("?a", "b")
    assert final([9, 11, 2], stop=["ab", "b"])[::3] == ("?", "ab")


def test_include_stop_str_streams_without_hold_back():
    # vLLM holds text back only when the stop string is to be cut from the output
    outs, _ = run([7, 4, 2, 3], RequestOutputKind.DELTA, stop=["zzzz"], include_stop_str_in_output=True)
    assert [o.outputs[0].text for o in outs] == ["m", " ", "a", "b"]
    outs, _ = run([7, 4, 2, 3], RequestOutputKind.DELTA, stop=["zzzz"])
    assert [o.outputs[0].text for o in outs] == ["", "", "", "m ab"]


def test_a_text_that_ends_inside_a_character_leaves_the_partial_bytes_out():
    """vLLM's detokenizer never emits a text ending in U+FFFD (it waits for bytes that never come); the ids keep
    the token. Token 100 of the tiny checkpoints' byte-level BPE is a lone partial UTF-8 byte."""
    from types import SimpleNamespace

    from mm_infer.engine.outputs.request_output import _finish_text

    def decode(ids, skip):
        return "".join({5: "ok", 100: "\ufffd"}[i] for i in ids)

    params = SimpleNamespace(include_stop_str_in_output=False, skip_special_tokens=True)
    seq = SimpleNamespace(final_text=None, output_token_ids=[5, 100, 5, 100], stop_terminated=False, params=params)
    assert _finish_text(seq, decode) == "ok\ufffdok"  # a partial byte inside the text stays, as in vLLM
