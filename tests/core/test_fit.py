"""The extender's 0..10 score relative to the best candidate (placement.fit.relative_score)."""

from gpushare.placement.fit import relative_score


def test_a_relative_score_is_ten_for_the_best_and_one_less_per_point_below():
    assert relative_score(73.5, 73.5) == 10
    assert relative_score(73.5, 73.0) == 9  # half a point below still loses the tie
    assert relative_score(73.5, 72.5) == 9
    assert relative_score(73.5, 72.0) == 8
    assert relative_score(73.5, 64.0) == 0
    assert relative_score(50.0, 10.0) == 0  # never below 0
