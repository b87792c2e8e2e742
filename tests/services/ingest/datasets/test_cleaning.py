"""Each cleaning step on small hand-made samples, and the pipeline's report adding up."""

from __future__ import annotations

import random
from collections import Counter

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.ingest.datasets.cleaning import CleaningReport, StepReport, TokenCounter, clean
from services.ingest.datasets.cleaning.basic import drop_empty, drop_overlong
from services.ingest.datasets.cleaning.dedup import dedup_exact, dedup_near
from services.ingest.datasets.cleaning.flags import flag_samples, is_refusal_text
from services.ingest.datasets.cleaning.pii import redact_pii, redact_samples
from services.ingest.datasets.cleaning.scoring import filter_by_score
from services.ingest.datasets.spec import CleaningOptions
from shared.chat import Message, RequestParams, ResponseMeta, ToolCall
from tests.services.ingest.datasets import make_sample

WORDS = [
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
    "mike",
    "november",
    "oscar",
    "papa",
    "quebec",
    "romeo",
    "sierra",
    "tango",
    "uniform",
    "victor",
    "whiskey",
    "xray",
    "yankee",
    "zulu",
]


def _prose(seed: int, count: int = 60) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) + str(rng.randint(0, 99)) for _ in range(count))


# --- drop_empty ---------------------------------------------------------------------------


def test_empty_messages_go_and_samples_without_an_answer_are_dropped() -> None:
    blank_turn = make_sample(
        "q",
        messages=[
            Message(role="system", content="  "),
            Message(role="user", content="What is 2+2?"),
            Message(role="assistant", content="4"),
        ],
    )
    no_answer = make_sample("only a question", answer=None, n=1)
    empty_prompt = make_sample(
        "", messages=[Message(role="user", content=" "), Message(role="assistant", content="x")]
    )
    kept, report = drop_empty([blank_turn, no_answer, empty_prompt])
    assert [m.role for m in kept[0].messages] == ["user", "assistant"]
    assert report == StepReport(
        "drop_empty",
        3,
        removed=2,
        changed=1,
        reasons={"empty_message": 1, "empty_prompt": 1, "no_completion": 1},
    )


def test_a_tool_call_turn_is_not_empty() -> None:
    sample = make_sample(
        "weather?",
        messages=[
            Message(role="user", content="weather in Paris?"),
            Message(role="assistant", tool_calls=[ToolCall(id="c1", name="w", arguments="{}")]),
        ],
    )
    kept, report = drop_empty([sample])
    assert kept == [sample]
    assert report.removed == report.changed == 0


# --- overlong -----------------------------------------------------------------------------


def _conversation(turns: int) -> list[Message]:
    messages = [Message(role="system", content="You are terse.")]
    for i in range(turns):
        messages.append(Message(role="user", content=f"Question {i}: " + _prose(i, 20)))
        messages.append(Message(role="assistant", content=f"Answer {i}: " + _prose(i + 50, 20)))
    return messages


def test_overlong_samples_are_dropped_in_real_tokens(tiny_tokenizer) -> None:
    counter = TokenCounter(tiny_tokenizer)
    short = make_sample("hi", messages=_conversation(1))
    long = make_sample("long", n=1, messages=_conversation(4))
    limit = counter.sample_count(short)
    assert counter.sample_count(long) > limit
    kept, report = drop_overlong([short, long], limit, "drop", counter)
    assert kept == [short]
    assert report.reasons == {"overlong": 1}


@settings(max_examples=150, deadline=None)
@given(texts=st.lists(st.text(max_size=300), min_size=1, max_size=6))
def test_the_byte_bound_is_never_below_the_real_count(tiny_tokenizer, texts) -> None:
    # The overlong step skips tokenising samples within budget by this bound: it must hold
    # for any text, emoji and control characters included.
    counter = TokenCounter(tiny_tokenizer)
    messages = [
        Message(role="user" if i % 2 == 0 else "assistant", content=t) for i, t in enumerate(texts)
    ]
    sample = make_sample("x", messages=messages)
    assert counter.upper_bound(sample) >= counter.sample_count(sample)


def test_skipping_samples_within_the_bound_changes_no_decision(tiny_tokenizer) -> None:
    samples = [make_sample(f"q{i}", n=i, messages=_conversation(1 + i % 4)) for i in range(24)]
    counter = TokenCounter(tiny_tokenizer)
    limit = sorted(counter.sample_count(s) for s in samples)[12]
    fresh = TokenCounter(tiny_tokenizer)
    kept, report = drop_overlong(samples, limit, "drop", fresh)
    assert kept == [s for s in samples if counter.sample_count(s) <= limit]
    assert report.removed == len(samples) - len(kept) > 0


def test_token_counts_track_the_chat_template(tiny_tokenizer) -> None:
    counter = TokenCounter(tiny_tokenizer)
    sample = make_sample("hi", messages=_conversation(2))
    rendered = tiny_tokenizer.apply_chat_template(
        [{"role": m.role, "content": m.text()} for m in sample.messages], tokenize=False
    )
    exact = len(tiny_tokenizer(rendered, add_special_tokens=False)["input_ids"])
    # Per-message counting differs from rendering the whole text only at message seams.
    assert abs(counter.sample_count(sample) - exact) <= len(sample.messages)


def test_truncate_drops_trailing_turns_until_it_fits(tiny_tokenizer) -> None:
    counter = TokenCounter(tiny_tokenizer)
    sample = make_sample("long", messages=_conversation(4))
    two_turns = make_sample("two", messages=_conversation(4)[:5])
    limit = counter.sample_count(two_turns) + 1
    kept, report = drop_overlong([sample], limit, "truncate", counter)
    assert [m.text() for m in kept[0].messages] == [m.text() for m in two_turns.messages]
    assert kept[0].messages[-1].role == "assistant"
    assert report.changed == 1
    assert report.reasons == {"truncated_turns": 1}
    # Not even one exchange fits: dropped, not cut into a prompt without an answer.
    _, report = drop_overlong([sample], 10, "truncate", counter)
    assert report.reasons == {"overlong": 1}


def test_without_a_tokenizer_counts_are_four_characters_a_token() -> None:
    counter = TokenCounter()
    assert counter.name == "approx:chars/4"
    assert counter.count("x" * 40) == 10


# --- dedup --------------------------------------------------------------------------------


def test_exact_duplicates_ignore_case_and_whitespace_and_keep_the_earliest() -> None:
    first = make_sample("What is the  capital of France?", "Paris.", n=1)
    later = make_sample("what is the capital of france?\n", "  paris.", n=5)
    other = make_sample("What is the capital of Spain?", "Madrid.", n=3)
    kept, report = dedup_exact([later, other, first])
    assert {s.id for s in kept} == {first.id, other.id}
    assert report.reasons == {"exact_duplicate": 1}


def test_near_duplicates_are_removed_and_distinct_samples_kept() -> None:
    text = _prose(1, 80)
    words = text.split()
    words[40] = "changed"  # one word of 80: Jaccard of 3-shingles stays above 0.9
    original = make_sample("summarise", text, n=1)
    near = make_sample("summarise", " ".join(words), n=2)
    distinct = make_sample("summarise", _prose(2, 80), n=3)
    kept, report = dedup_near([near, distinct, original], 0.9)
    assert {s.id for s in kept} == {original.id, distinct.id}
    assert report.reasons == {"near_duplicate": 1}


def test_a_shared_system_prompt_does_not_make_samples_near_duplicates() -> None:
    system = _prose(7, 300)
    a = make_sample("What is the capital of France?", "Paris.", system=system, n=1)
    b = make_sample("How do I reset my password?", "Use the link.", system=system, n=2)
    kept, report = dedup_near([a, b], 0.9)
    assert len(kept) == 2
    assert report.removed == 0


# --- PII ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected", "kind"),
    [
        ("mail jane.doe+test@example.co.uk today", "mail [EMAIL] today", "email"),
        ("card 4111 1111 1111 1111 please", "card [CARD] please", "card"),
        ("card 4111-1111-1111-1111.", "card [CARD].", "card"),
        ("call +1 (415) 555-0123 now", "call [PHONE] now", "phone"),
        ("call 415-555-0199", "call [PHONE]", "phone"),
        ("ruf +49 30 1234567 an", "ruf [PHONE] an", "phone"),
        ("appelle 06 12 34 56 78", "appelle [PHONE]", "phone"),
        ("key sk-proj-A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6", "key [REDACTED]", "secret"),
    ],
)
def test_pii_is_replaced_by_typed_placeholders(text: str, expected: str, kind: str) -> None:
    counts: Counter[str] = Counter()
    assert redact_pii(text, counts) == expected
    assert counts == {kind: 1}


@pytest.mark.parametrize(
    "text",
    [
        "card 4111 1111 1111 1112 fails the Luhn check",
        "order 20240115 shipped 2024-01-15 at 10:30 for $1,299.00 (v1.2.3.4)",
        "ids 1234567890123 and 987654321 and ip 192.168.10.20",
        "an @mention and user@localhost are not addresses",
    ],
)
def test_numbers_and_text_that_are_not_pii_stay(text: str) -> None:
    counts: Counter[str] = Counter()
    assert redact_pii(text, counts) == text
    assert not counts


def test_redaction_reaches_tool_arguments_and_keeps_them_json() -> None:
    sample = make_sample(
        "q",
        messages=[
            Message(role="user", content="email bob@example.com about it"),
            Message(
                role="assistant",
                tool_calls=[
                    ToolCall(
                        id="c1",
                        name="send",
                        arguments={"to": "bob@example.com", "password": "hunter2", "n": 3},
                    )
                ],
            ),
        ],
    )
    clean_sample = make_sample("nothing to see", n=1)
    out, report, counts = redact_samples([sample, clean_sample])
    arguments = orjson.loads(out[0].messages[1].tool_calls[0].arguments)
    assert arguments == {"to": "[EMAIL]", "password": "[REDACTED]", "n": 3}
    assert out[0].messages[0].text() == "email [EMAIL] about it"
    assert out[1] is clean_sample
    assert counts == {"email": 2, "secret": 1}
    assert report.changed == 1
    assert report.removed == 0


# --- flags --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "refusal"),
    [
        ("I'm sorry, but I can't help with that.", True),
        ("I\u2019m sorry, but I cannot assist with this request.", True),
        ("I can't help with creating malware.", True),
        ("As an AI language model, I cannot browse the internet.", True),
        ("I apologize, but I won't write that.", True),
        ("I can't wait to help you plan the trip!", False),
        ("Sure! Note that I cannot stress enough how important tests are.", False),
        ("The bot replied \"I'm sorry, but I can't help\" and stopped.", False),
    ],
)
def test_the_refusal_heuristic(text: str, refusal: bool) -> None:
    assert is_refusal_text(text) is refusal


def _flag(samples, **options):
    defaults = {"refusals": True, "truncated": True, "expect_json": False, "keep": False}
    return flag_samples(samples, **{**defaults, **options})


def test_refusals_truncations_and_bad_json_are_dropped_by_default() -> None:
    refused = make_sample("q", messages=[Message(role="user", content="q")], n=1)
    refused = refused.model_copy(
        update={"messages": [*refused.messages, Message(role="assistant", refusal="No.")]}
    )
    phrased = make_sample("q2", "I'm sorry, but I can't help with that.", n=2)
    cut = make_sample("q3", "The answer is", finish="length", n=3)
    bad_json = make_sample(
        "q4", "{not json", params=RequestParams(response_format={"type": "json_object"}), n=4
    )
    good_json = make_sample(
        "q5", '{"a": 1}', params=RequestParams(response_format={"type": "json_object"}), n=5
    )
    fine = make_sample("q6", "Sure, here it is.", n=6)
    kept, report, flagged = _flag([refused, phrased, cut, bad_json, good_json, fine])
    assert kept == [good_json, fine]
    assert report.reasons == {"format_error": 1, "refusal": 2, "truncated": 1}
    assert flagged == {"refusal": 2, "truncated": 1, "format_error": 1}


def test_expect_json_checks_every_sample_and_keep_flagged_tags_them() -> None:
    prose = make_sample("q", "plain words", n=1)
    kept, report, flagged = _flag([prose], expect_json=True, keep=True)
    assert kept[0].tags == ["flag:format_error"]
    assert report.removed == 0
    assert report.changed == 1
    assert flagged == {"format_error": 1}


def test_content_filter_counts_as_a_refusal_and_flags_can_be_off() -> None:
    filtered = make_sample(
        "q", "", response=ResponseMeta(provider="anthropic", finish_reason_raw="refusal")
    )
    assert _flag([filtered])[2] == {"refusal": 1}
    assert _flag([filtered], refusals=False)[0] == [filtered]


# --- scoring ------------------------------------------------------------------------------


def test_rejection_sampling_reads_metadata_then_feedback_tags() -> None:
    judged = make_sample("a", n=1, metadata={"score": 0.9})
    low = make_sample("b", n=2, metadata={"score": 0.2})
    tagged = make_sample("c", n=3, tags=["score:4", "score:5"])
    unscored = make_sample("d", n=4, tags=["score:great"])
    kept, report = filter_by_score([judged, low, tagged, unscored], 0.5, "score")
    assert kept == [judged, tagged]
    assert report.reasons == {"below_min_score": 1, "no_score": 1}


def test_a_feedback_score_comes_first_under_the_key_score_only() -> None:
    judged_low = make_sample("a", n=1, metadata={"score": 0.1, "judge": 9})
    judged_high = make_sample("b", n=2, metadata={"score": 0.9, "judge": 2})
    unscored = make_sample("c", n=3)
    feedback = {judged_low.id: 0.8, judged_high.id: 0.3, unscored.id: 1.0}
    samples = [judged_low, judged_high, unscored]
    # Under `score` the newest feedback overrides the sample's own score, and scores one
    # that has none.
    kept, report = filter_by_score(samples, 0.5, "score", feedback)
    assert kept == [judged_low, unscored]
    assert report.reasons == {"below_min_score": 1}
    # Under another key (a judge's scale) feedback is not mixed in.
    kept, _ = filter_by_score(samples, 5, "judge", feedback)
    assert kept == [judged_low]


# --- the pipeline -------------------------------------------------------------------------


def _messy_batch() -> list:
    base = [
        make_sample(f"question {i}: " + _prose(i, 30), _prose(i + 100, 40), n=i) for i in range(30)
    ]
    return [
        *base,
        make_sample("question 0: " + _prose(0, 30), _prose(100, 40), n=40),  # exact dup
        make_sample("no answer", answer=None, n=41),
        make_sample("refuse", "I cannot help with that request.", n=42),
        make_sample("cut", "and then", finish="length", n=43),
        make_sample("mail me at a.b@example.com", "ok, a.b@example.com noted", n=44),
    ]


def test_the_report_adds_up_and_names_every_step() -> None:
    steps: list[StepReport] = []
    out, report = clean(_messy_batch(), CleaningOptions(min_score=None), on_step=steps.append)
    assert [s.step for s in report.steps] == [
        "drop_empty",
        "flags",
        "dedup_exact",
        "dedup_near",
        "redact_pii",
    ]
    assert steps == report.steps
    assert report.input_count - report.removed == report.output_count == len(out) == 31
    for before, after in zip(report.steps, report.steps[1:], strict=False):
        assert after.samples_in == before.samples_out
    assert report.flagged == {"refusal": 1, "truncated": 1}
    assert report.pii == {"email": 2}
    assert CleaningReport.from_dict(report.to_dict()) == report


def test_cleaning_does_not_depend_on_input_order() -> None:
    batch = _messy_batch()
    shuffled = batch[:]
    random.Random(3).shuffle(shuffled)
    first, _ = clean(batch, CleaningOptions())
    second, _ = clean(shuffled, CleaningOptions())
    assert [s.to_json_bytes() for s in first] == [s.to_json_bytes() for s in second]


def test_keep_flagged_keeps_and_tags(tiny_tokenizer) -> None:
    options = CleaningOptions(keep_flagged=True, max_tokens=4096, min_score=None)
    out, report = clean(_messy_batch(), options, tokenizer=tiny_tokenizer)
    tagged = {t for s in out for t in s.tags}
    assert {"flag:refusal", "flag:truncated"} <= tagged
    assert "overlong" in [s.step for s in report.steps]
    assert report.input_count - report.removed == len(out) == 33
