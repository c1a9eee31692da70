"""The whole tiny Nemotron Omni (RADIO vision, projector, hybrid Mamba-2 / attention / MoE LM) against HF's
NemotronH_Omni_Reasoning_V3 in float32, loaded from the released tensor layout; and the ablations that must move the
logits past the tolerance."""

from __future__ import annotations

import pytest
import torch

from tests.models.nemotron_omni_cases import TOL, hf, image_prompt, ours, text_ids, video_prompt

DIFFS: dict[str, float] = {}


@torch.no_grad()
def both(ids, **media):
    """(our logits, HF's logits) [N, V] for one prompt."""
    x = torch.tensor(ids)
    mine = ours()(x, **media)
    theirs = hf()(input_ids=x[None], **media).logits[0].float()
    return mine, theirs


CASES = {
    "text": lambda: (text_ids(40, 1), {}),
    "one image": lambda: (lambda ids, p: (ids, dict(pixel_values=p, image_grid_hw=torch.tensor([[4, 6]]))))(
        *image_prompt([(4, 6)])),
    "two images": lambda: (lambda ids, p: (ids, dict(pixel_values=p, image_grid_hw=torch.tensor([[4, 6], [8, 2]]))))(
        *image_prompt([(4, 6), (8, 2)], seed=3)),
    "video": lambda: (lambda ids, v: (ids, dict(pixel_values_videos=v[None])))(*video_prompt(3, 2, 4)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_logits_equal_hf(case):
    # catches: any layer of the hybrid stack, the vision path or the splice into <image> tokens wrong
    ids, media = CASES[case]()
    mine, theirs = both(ids, **media)
    DIFFS[case] = (mine - theirs).abs().max().item()
    assert DIFFS[case] <= TOL, (case, DIFFS[case])


def test_transformers_names_load_the_same_weights():
    # catches: a name of transformers' layout (stacked experts, split q/k/v) mapped to the wrong parameter
    from mm_infer.models.loader import load_state_dict_into
    from mm_infer.models.nemotron_omni import NemotronOmniModel

    mine = ours()
    fresh = NemotronOmniModel(mine.config).float()
    state = {k: v for k, v in hf().state_dict().items()}
    filled = load_state_dict_into(fresh, state, strict=True)
    assert filled == {n for n, _ in fresh.named_parameters()}
    for (name, a), (_, b) in zip(mine.named_parameters(), fresh.named_parameters(), strict=True):
        assert torch.equal(a, b), name


def _moved(case: str = "one image") -> float:
    ids, media = CASES[case]()
    mine, theirs = both(ids, **media)
    return (mine - theirs).abs().max().item()


@pytest.mark.parametrize("ablation", ["no shared expert", "conv padded on the right", "scan over the batch"])
def test_ablations_move_the_logits(ablation, monkeypatch):
    # the bugs the parity tests above catch: each of these moves the logits far past TOL
    from mm_infer.models import mamba2, nemotron_moe
    from mm_infer.models.recurrent_batch import RecurrentBatch

    if ablation == "no shared expert":
        for m in ours().modules():
            if isinstance(m, nemotron_moe.NemotronMoE):
                monkeypatch.setattr(m.shared_experts, "forward", torch.zeros_like)
    elif ablation == "conv padded on the right":
        real = mamba2.Mamba2Mixer._conv

        def right(self, xbc, state):
            out = real(self, xbc.flip(0), state)
            return out.flip(0)
        monkeypatch.setattr(mamba2.Mamba2Mixer, "_conv", right)
    else:  # two sequences' tokens through one scan: chunk boundaries from the batch, state leaking across
        def batch_scan(self, layer, mixer, h):
            state = self.pool.read(layer, None)
            return mixer(h, state)
        monkeypatch.setattr(RecurrentBatch, "run_layer", batch_scan)
        ids_a, ids_b = text_ids(20, 5), text_ids(20, 6)
        with torch.no_grad():
            from mm_infer.models.attention import DenseAttentionContext
            from mm_infer.models.recurrent_batch import fresh_batch

            m = ours()
            x = torch.tensor(ids_a + ids_b)
            ctx = DenseAttentionContext([20, 20])
            ctx.recurrent = fresh_batch(m.state_pool(2), [20, 20])
            packed = m.compute_logits(m.forward_hidden(m.embed_tokens(x), torch.empty(0), ctx))
            alone = hf()(input_ids=torch.tensor([ids_b])).logits[0]
        assert (packed[20:] - alone).abs().max().item() > 100 * TOL
        return
    assert _moved() > 100 * TOL


def test_report_diffs():
    print("\nNemotron Omni vs HF, max |logit diff|:", {k: f"{v:.2e}" for k, v in DIFFS.items()})
