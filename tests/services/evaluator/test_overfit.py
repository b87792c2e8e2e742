"""The overfit rule on recorded curves: (step, subset task score, train loss) per scored point."""

from __future__ import annotations

from services.evaluator.overfit import Rule, Scored, overfitting


def curve(*points: tuple[int, float, float | None]) -> list[Scored]:
    return [Scored(step, score, loss) for step, score, loss in points]


# A run that peaks at step 30 and then memorises its training data: the loss keeps falling.
OVERFITTING = curve(
    (10, 0.50, 1.20), (20, 0.75, 0.80), (30, 0.875, 0.50), (40, 0.8125, 0.30),
    (50, 0.75, 0.15), (60, 0.6875, 0.07), (70, 0.625, 0.03),
)  # fmt: skip


def test_a_falling_score_with_a_falling_loss_stops_at_the_third_fall() -> None:
    assert overfitting(OVERFITTING[:5]) is None  # two falls so far
    reason = overfitting(OVERFITTING[:6])
    assert reason is not None
    assert "fell 3 evals in a row by at least 0.02" in reason
    assert "step 30 0.875, step 40 0.812, step 50 0.750, step 60 0.688" in reason
    assert "(0.5000, 0.3000, 0.1500, 0.0700)" in reason
    assert "the best so far is step 30 (0.875)" in reason
    # Later points change nothing: the first run of falls is the one named.
    assert overfitting(OVERFITTING) == reason
    assert overfitting(list(reversed(OVERFITTING[:6]))) == reason  # step order, not list order


def test_noisy_scores_without_three_falls_in_a_row_do_not_stop() -> None:
    noisy = curve(
        (10, 0.60, 1.0), (20, 0.55, 0.9), (30, 0.50, 0.8), (40, 0.58, 0.7),
        (50, 0.52, 0.6), (60, 0.47, 0.5), (70, 0.49, 0.4), (80, 0.45, 0.3), (90, 0.41, 0.2),
    )  # fmt: skip
    assert overfitting(noisy) is None
    plateau = curve((10, 0.9, 0.5), (20, 0.9, 0.4), (30, 0.9, 0.3), (40, 0.9, 0.2))
    assert overfitting(plateau) is None


def test_a_falling_score_with_a_rising_loss_is_not_overfitting() -> None:
    diverging = curve((10, 0.8, 0.40), (20, 0.7, 0.55), (30, 0.6, 0.90), (40, 0.5, 1.60))
    assert overfitting(diverging) is None
    # One rise in the loss inside the window is enough to hold off.
    mixed = curve((10, 0.8, 0.40), (20, 0.7, 0.30), (30, 0.6, 0.35), (40, 0.5, 0.20))
    assert overfitting(mixed) is None
    flat_loss = curve((10, 0.8, 0.3), (20, 0.7, 0.3), (30, 0.6, 0.3), (40, 0.5, 0.3))
    assert overfitting(flat_loss) is None


def test_a_point_without_a_train_loss_never_counts() -> None:
    unknown = curve((10, 0.8, 0.4), (20, 0.7, None), (30, 0.6, 0.2), (40, 0.5, 0.1))
    assert overfitting(unknown) is None


def test_the_margin_edges() -> None:
    # Falls of exactly the margin count (float error allowed for); a hair less does not.
    exact = curve((10, 0.85, 0.4), (20, 0.83, 0.3), (30, 0.81, 0.2), (40, 0.79, 0.1))
    assert overfitting(exact, Rule(margin=0.02)) is not None
    short = curve((10, 0.85, 0.4), (20, 0.83, 0.3), (30, 0.811, 0.2), (40, 0.79, 0.1))
    assert overfitting(short, Rule(margin=0.02)) is None
    assert overfitting(short, Rule(margin=0.015)) is not None
    # Margin 0: any fall counts, a tie does not (the loss alone falling is not enough).
    ties = curve((10, 0.8, 0.4), (20, 0.8, 0.3), (30, 0.79, 0.2), (40, 0.78, 0.1))
    assert overfitting(ties, Rule(margin=0.0)) is None
    assert overfitting(ties[1:] + curve((50, 0.7, 0.05)), Rule(margin=0.0)) is not None


def test_the_number_of_falls_is_the_rules() -> None:
    assert overfitting(OVERFITTING[:5], Rule(evals=2)) is not None
    assert overfitting(OVERFITTING, Rule(evals=5)) is None
    assert overfitting(OVERFITTING[:3]) is None  # too few points for any window
    assert overfitting([]) is None
