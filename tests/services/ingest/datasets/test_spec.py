"""The dataset request body: unknown fields and bad values are errors that name the field."""

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from services.ingest.datasets.spec import DatasetSpec, SampleFilter, SplitOptions, stratum_of
from tests.services.ingest.datasets import make_sample


def _error(body: dict) -> str:
    with pytest.raises(ValidationError) as caught:
        DatasetSpec.model_validate(body)
    return str(caught.value)


def test_feedback_filters_take_one_label_or_several_and_refuse_what_no_label_is() -> None:
    assert SampleFilter.model_validate({"feedback_label": "good"}).feedback_label == ["good"]
    both = SampleFilter.model_validate({"feedback_label": ["good", "ok"], "min_feedback_score": 1})
    assert (both.feedback_label, both.min_feedback_score) == (["good", "ok"], 1.0)
    assert "source.feedback_label" in _error({"name": "x", "source": {"feedback_label": 3}})
    message = _error({"name": "x", "source": {"feedback_label": ["good", "so so"]}})
    assert "feedback_label[1]: 'so so' is not" in message
    assert "min_feedback_score" in _error(
        {"name": "x", "source": {"min_feedback_score": float("nan")}}
    )


def test_a_minimal_spec_takes_the_recommended_defaults() -> None:
    spec = DatasetSpec.model_validate({"name": "support", "source": {}})
    assert spec.cleaning.dedup_exact
    assert spec.cleaning.redact_pii
    assert spec.cleaning.near_dup_threshold == 0.9
    assert spec.source is not None
    assert spec.source.status == "ok"
    assert spec.split.eval_size is None


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"name": "x", "source": {"modle": ["a"]}}, "source.modle"),
        ({"name": "x", "source": {}, "cleaning": {"max_token": 5}}, "cleaning.max_token"),
        ({"name": "x", "source": {}, "split": {"evalsize": 5}}, "split.evalsize"),
        ({"name": "x", "source": {}, "colour": "red"}, "colour"),
    ],
)
def test_an_unknown_field_is_named(body: dict, named: str) -> None:
    message = _error(body)
    assert named in message
    assert "Extra inputs are not permitted" in message


def test_a_spec_needs_a_filter_or_files() -> None:
    assert "source / file_ids" in _error({"name": "x"})
    both = DatasetSpec.model_validate({"name": "x", "source": {}, "file_ids": ["file-1"]})
    assert both.file_ids == ["file-1"]


def test_bad_values_name_their_field() -> None:
    assert "split.eval_size" in _error({"name": "x", "source": {}, "split": {"eval_size": 1.5}})
    assert "split.eval_size" in _error({"name": "x", "source": {}, "split": {"eval_size": -1}})
    assert "split.stratify_by" in _error(
        {"name": "x", "source": {}, "split": {"stratify_by": "colour"}}
    )
    assert "cleaning.near_dup_threshold" in _error(
        {"name": "x", "source": {}, "cleaning": {"near_dup_threshold": 0}}
    )
    assert "source.since" in _error(
        {"name": "x", "source": {"since": "2025-01-01T00:00:00"}}  # no time zone
    )
    assert "file_ids" in _error({"name": "x", "file_ids": ["a", "a"]})


def test_eval_size_keeps_counts_and_fractions_apart() -> None:
    assert SplitOptions(eval_size=100).eval_size == 100
    assert SplitOptions(eval_size=0.2).eval_size == 0.2
    with pytest.raises(ValidationError, match="boolean"):
        SplitOptions(eval_size=True)


def test_the_filter_matches_time_model_tags_and_metadata() -> None:
    sample = make_sample("hi", n=10, model="gpt-4o-mini", tags=["prod", "beta"])
    sample = sample.model_copy(update={"metadata": {"team": "search", "vip": True}})
    assert SampleFilter(models=["gpt-4o-mini"], tags=["prod"]).matches(sample)
    assert SampleFilter(metadata={"team": "search", "vip": True}).matches(sample)
    assert not SampleFilter(metadata={"vip": 1}).matches(sample)
    assert not SampleFilter(tags=["prod", "alpha"]).matches(sample)
    assert not SampleFilter(until=datetime(2025, 1, 1, 0, 5, tzinfo=UTC)).matches(sample)
    assert not SampleFilter(status="error").matches(sample)
    assert not SampleFilter(providers=["anthropic"]).matches(sample)


def test_strata_come_from_the_named_key() -> None:
    sample = make_sample("hi", model="m1", tags=["lang:de", "x"])
    sample = sample.model_copy(update={"metadata": {"team": "a"}})
    assert stratum_of(sample, "model") == "m1"
    assert stratum_of(sample, "tag:lang:") == "lang:de"
    assert stratum_of(sample, "metadata.team") == "'a'"
    assert stratum_of(sample, "metadata.missing") == ""
    assert stratum_of(sample, None) == ""


def test_eval_files_are_checked_like_files_and_exclude_a_random_eval_split() -> None:
    spec = DatasetSpec.model_validate(
        {"name": "x", "file_ids": ["file-t"], "eval_file_ids": ["file-v"]}
    )
    assert spec.eval_file_ids == ["file-v"]
    zero = {"name": "x", "file_ids": ["a"], "eval_file_ids": ["b"], "split": {"eval_size": 0}}
    assert DatasetSpec.model_validate(zero).split.eval_size == 0
    assert "eval_file_ids[0] is empty" in _error(
        {"name": "x", "source": {}, "eval_file_ids": [" "]}
    )
    assert "eval_file_ids: the same file" in _error(
        {"name": "x", "source": {}, "eval_file_ids": ["b", "b"]}
    )
    both = _error({"name": "x", "file_ids": ["a", "b"], "eval_file_ids": ["b"]})
    assert "eval_file_ids[0]: 'b' is also in file_ids" in both
    sized = _error(
        {"name": "x", "file_ids": ["a"], "eval_file_ids": ["b"], "split": {"eval_size": 5}}
    )
    assert "split.eval_size: must be unset or 0 when eval_file_ids are given" in sized
    # Eval files alone leave nothing to train on.
    assert "source / file_ids" in _error({"name": "x", "eval_file_ids": ["b"]})
