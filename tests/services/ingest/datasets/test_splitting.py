"""The train/eval split and eval decontamination."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from services.ingest.datasets.cleaning import clean_and_split
from services.ingest.datasets.cleaning.decontam import decontaminate
from services.ingest.datasets.spec import CleaningOptions, SplitOptions
from services.ingest.datasets.split import SplitError, eval_count, split
from tests.services.ingest.datasets import make_sample


def _samples(count: int, **fields) -> list:
    return [make_sample(f"question number {i}", f"answer {i}", n=i, **fields) for i in range(count)]


def _ids(samples) -> list[str]:
    return [s.id for s in samples]


def test_the_split_depends_on_the_seed_not_the_input_order() -> None:
    samples = _samples(200)
    shuffled = samples[:]
    random.Random(1).shuffle(shuffled)
    train, eval_ = split(samples, SplitOptions(seed=7))
    train2, eval2 = split(shuffled, SplitOptions(seed=7))
    assert (_ids(train), _ids(eval_)) == (_ids(train2), _ids(eval2))
    assert len(eval_) == 20
    assert _ids(eval_) == sorted(_ids(eval_))
    _, other_seed = split(samples, SplitOptions(seed=8))
    assert set(_ids(other_seed)) != set(_ids(eval_))


@pytest.mark.parametrize(
    ("total", "size", "expected"),
    [
        (200, None, 20),
        (50_000, None, 1000),
        (5, None, 1),
        (1, None, 0),
        (200, 30, 30),
        (200, 0.25, 50),
    ],
)
def test_eval_size_auto_count_and_fraction(total: int, size, expected: int) -> None:
    assert eval_count(total, size) == expected


def test_impossible_sizes_are_errors_naming_the_field() -> None:
    with pytest.raises(SplitError, match=r"split.eval_size: 500 .* only 400 samples"):
        eval_count(400, 500)
    with pytest.raises(SplitError, match=r"split\.eval_size"):
        eval_count(3, 0.9)
    with pytest.raises(SplitError, match="selection is empty"):
        split([], SplitOptions())


def test_eval_never_overlaps_train_by_id_content_or_prompt() -> None:
    samples = _samples(60)
    # Sibling choices of one request: same prompt, different answers; and a repeated sample.
    siblings = [make_sample("question number 3", f"other answer {k}", n=100 + k) for k in range(3)]
    repeat = samples[10].model_copy()
    train, eval_ = split([*samples, *siblings, repeat], SplitOptions(eval_size=30, seed=2))
    assert len(train) + len(eval_) == 64
    assert not set(_ids(train)) & set(_ids(eval_))
    fingerprints = {s.content_fingerprint() for s in eval_}
    assert not fingerprints & {s.content_fingerprint() for s in train}
    prompts = {s.prompt_fingerprint() for s in eval_}
    assert not prompts & {s.prompt_fingerprint() for s in train}


def test_stratified_split_keeps_each_stratum_share() -> None:
    samples = [
        make_sample(f"q {i}", "a", n=i, model="big" if i % 4 == 0 else "small") for i in range(400)
    ]
    _, eval_ = split(samples, SplitOptions(eval_size=40, stratify_by="model"))
    by_model = Counter(s.response.model for s in eval_)
    assert by_model == {"big": 10, "small": 30}


def test_decontamination_removes_train_samples_that_share_an_ngram_with_eval() -> None:
    leaked_text = "the quarterly revenue of the northern division grew by twelve percent last year"
    eval_sample = make_sample("report", f"Summary: {leaked_text}.", n=1)
    leaked = make_sample("other question", f"As noted, {leaked_text} overall", n=2)
    clean_one = make_sample("unrelated", "the weather is sunny today in the south", n=3)
    train, report = decontaminate([leaked, clean_one], [eval_sample], 13, 10)
    assert train == [clean_one]
    assert report.reasons == {"eval_overlap": 1}
    assert report.samples_in == 3


def test_boilerplate_shared_by_many_samples_is_not_contamination() -> None:
    template = (
        "classify the sentiment of the following customer review as positive negative or neutral"
    )
    train = [make_sample(f"{template}: review {i} words", "positive", n=i) for i in range(20)]
    eval_ = [make_sample(f"{template}: another review", "negative", n=99)]
    kept, report = decontaminate(train, eval_, 13, 10)
    assert len(kept) == 20
    assert report.removed == 0
    # The same overlap in a handful of samples is a leak.
    kept, report = decontaminate(train[:3], eval_, 13, 10)
    assert kept == []
    assert report.removed == 3


def test_clean_and_split_counts_add_up_to_train_plus_eval() -> None:
    samples = _samples(100)
    leaked = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike"
    samples += [make_sample(f"leak {k}", f"x {leaked} {k}", n=200 + k) for k in range(2)]
    samples += [make_sample("no answer", None, n=300)]
    train, eval_, report = clean_and_split(
        samples, CleaningOptions(), SplitOptions(eval_size=50, seed=1)
    )
    assert report.steps[-1].step == "decontaminate"
    assert report.input_count - report.removed == len(train) + len(eval_)
    assert (report.train_count, report.eval_count) == (len(train), len(eval_))


def test_cleaning_everything_away_is_a_split_error() -> None:
    with pytest.raises(SplitError, match="cleaning removed every sample"):
        clean_and_split([make_sample("q", None, n=1)], CleaningOptions(), SplitOptions())


def test_given_eval_samples_are_the_eval_split_exactly() -> None:
    train_in = _samples(30)
    leaked = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike"
    eval_in = [make_sample(f"held out {k}", f"reply {k}", n=100 + k) for k in range(5)]
    eval_in.append(make_sample("held out leak", f"x {leaked}", n=110))
    eval_in.append(make_sample("held out empty", None, n=111))  # cleaned like the rest
    # An earlier train copy of an eval sample: dedup would keep the train one; the eval one stays.
    train_in.append(make_sample("held out 0", "reply 0", n=-1))
    train_in.append(make_sample("held out 1", "another reply", n=40))  # an eval prompt
    train_in.append(make_sample("leaks", f"y {leaked} too", n=41))
    steps: list[str] = []
    train, eval_, report = clean_and_split(
        train_in,
        CleaningOptions(),
        SplitOptions(),
        eval_samples=eval_in,
        on_step=lambda step: steps.append(step.step),
    )
    assert _ids(eval_) == sorted(_ids(eval_in[:6]))
    assert _ids(train) == sorted(_ids(train_in[:30]))
    assert [s.step for s in report.steps] == steps
    assert steps[-2:] == ["eval_prompts", "decontaminate"]
    assert report.input_count == len(train_in) + len(eval_in)
    assert report.input_count - report.removed == len(train) + len(eval_)
    for before, after in zip(report.steps, report.steps[1:], strict=False):
        assert after.samples_in == before.samples_out
    assert (report.train_count, report.eval_count) == (30, 6)


def test_eval_samples_cleaned_away_is_a_split_error_naming_eval_file_ids() -> None:
    with pytest.raises(SplitError, match="eval_file_ids"):
        clean_and_split(
            _samples(5),
            CleaningOptions(),
            SplitOptions(),
            eval_samples=[make_sample("q", None, n=1)],
        )
