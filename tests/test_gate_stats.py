"""The statistics' contracts: the paired interval refuses counts that cannot be, and repeated looks at one set spend
its error so each later look is judged wider."""

import pytest

from edge.model.gate_stats import (
    FAMILY_CONFIDENCE,
    MAX_LOOKS,
    Z95,
    look_confidence,
    paired_drop_interval,
    top1_claim,
    z_of,
)


@pytest.mark.parametrize("b, c, n", [(-1, 0, 10), (0, -2, 10), (6, 5, 10), (11, 0, 10), (1, 0, 0)])
def test_discordant_pairs_that_do_not_fit_the_pairs_are_refused(b, c, n):
    with pytest.raises(ValueError, match="do not fit"):
        paired_drop_interval(b, c, n)


def test_the_looks_together_spend_at_most_five_percent_and_each_later_one_is_wider():
    assert z_of(0.95) == pytest.approx(Z95)
    spent = sum(1 - look_confidence(k) for k in range(1, 100000))
    assert spent == pytest.approx(1 - FAMILY_CONFIDENCE, rel=1e-4) and spent < 1 - FAMILY_CONFIDENCE
    widths = [paired_drop_interval(6, 2, 300, z_of(look_confidence(k))) for k in range(1, MAX_LOOKS + 1)]
    assert all(later[1] > earlier[1] and later[0] < earlier[0] for earlier, later in zip(widths, widths[1:]))
    assert round(100 * look_confidence(1), 2) == 96.96 and round(100 * look_confidence(2), 2) == 99.24
    with pytest.raises(ValueError):
        look_confidence(0)


def test_a_later_look_states_its_own_confidence_and_can_turn_a_pass_inconclusive():
    first, second = top1_claim(0, 0, 297, 2.0, look_confidence(1)), top1_claim(0, 0, 297, 2.0, look_confidence(2))
    assert first["verdict"] == "pass" and "at 96.96 % (297 labelled images" in first["claim"]
    assert second["verdict"] == "inconclusive" and "at 99.24 % on 297" in second["claim"]
    assert "planning assumption: 1 in 297 images changes correctness (none did here)" in second["claim"]
    assert second["labels_needed"] > 0 and first["labels_needed"] is None
