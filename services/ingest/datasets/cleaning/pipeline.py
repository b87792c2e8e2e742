"""The cleaning pipeline: small steps run in a fixed order, each reporting what it removed or
changed, then the split and eval decontamination.

Order: cheap filters first, so the expensive steps see fewer samples; truncation before dedup,
because cutting turns can make two samples equal; PII last, on what is left.

    drop_empty -> flags -> min_score -> overlong -> dedup_exact -> dedup_near -> redact_pii
    -> split -> decontaminate (train only)

With eval files (DatasetSpec.eval_file_ids) train and eval are cleaned apart and the split is
replaced by `eval_prompts`: train samples asking an eval prompt go.

Samples are handled as the validated models they came in as; steps copy what they change
(`model_copy`, no re-validation) and never re-parse.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

# A module import: splitting imports cleaning.text, so this package is half-loaded then.
from services.ingest.datasets import split as splitting
from services.ingest.datasets.cleaning.basic import drop_empty, drop_overlong
from services.ingest.datasets.cleaning.decontam import decontaminate
from services.ingest.datasets.cleaning.dedup import dedup_exact, dedup_near
from services.ingest.datasets.cleaning.flags import flag_samples
from services.ingest.datasets.cleaning.pii import redact_samples
from services.ingest.datasets.cleaning.report import CleaningReport, StepReport
from services.ingest.datasets.cleaning.scoring import filter_by_score
from services.ingest.datasets.cleaning.text import WordCache, prompt_key
from services.ingest.datasets.cleaning.tokens import TokenCounter
from services.ingest.datasets.spec import CleaningOptions, SplitOptions
from shared.chat import Sample

OnStep = Callable[[StepReport], None]
_Step = Callable[[list[Sample]], tuple[list[Sample], StepReport]]


def _steps(
    options: CleaningOptions,
    counter: TokenCounter,
    words: WordCache,
    report: CleaningReport,
    feedback: Mapping[str, float] | None,
) -> list[_Step]:
    def flags(samples: list[Sample]) -> tuple[list[Sample], StepReport]:
        kept, step, flagged = flag_samples(
            samples,
            refusals=options.flag_refusals,
            truncated=options.flag_truncated,
            expect_json=options.expect_json,
            keep=options.keep_flagged,
        )
        report.flagged = flagged
        return kept, step

    def pii(samples: list[Sample]) -> tuple[list[Sample], StepReport]:
        kept, step, counts = redact_samples(samples)
        report.pii = counts
        return kept, step

    steps: list[_Step] = []
    if options.drop_empty:
        steps.append(drop_empty)
    steps.append(flags)
    if (min_score := options.min_score) is not None:
        steps.append(lambda s: filter_by_score(s, min_score, options.score_key, feedback))
    if (max_tokens := options.max_tokens) is not None:
        steps.append(lambda s: drop_overlong(s, max_tokens, options.overlong, counter))
    if options.dedup_exact:
        steps.append(dedup_exact)
    if (threshold := options.near_dup_threshold) is not None:
        steps.append(lambda s: dedup_near(s, threshold, words))
    if options.redact_pii:
        steps.append(pii)
    return steps


def clean(
    samples: Sequence[Sample],
    options: CleaningOptions,
    *,
    tokenizer: Any | None = None,
    on_step: OnStep | None = None,
    words: WordCache | None = None,
    feedback_scores: Mapping[str, float] | None = None,
) -> tuple[list[Sample], CleaningReport]:
    """Run the cleaning steps; the result is ordered by (created_at, id) whatever the input
    order. `tokenizer`: a Hugging Face tokenizer or a TokenCounter (None: approximate counts).
    `on_step` is called after each step (progress events); `words` shares word hashes with a
    later decontamination; `feedback_scores` (sample id -> newest feedback score) are what
    `min_score` reads first under the key `score` (cleaning.scoring)."""
    current = sorted(samples, key=lambda s: (s.created_at, s.id))
    report = CleaningReport(input_count=len(current), output_count=len(current))
    counter = TokenCounter.of(tokenizer)
    for step in _steps(options, counter, words or WordCache(), report, feedback_scores):
        current, step_report = step(current)
        report.add(step_report)
        if on_step is not None:
            on_step(step_report)
    return current, report


def clean_and_split(
    samples: Sequence[Sample],
    cleaning: CleaningOptions,
    split_options: SplitOptions,
    *,
    eval_samples: Sequence[Sample] | None = None,
    tokenizer: Any | None = None,
    on_step: OnStep | None = None,
    feedback_scores: Mapping[str, float] | None = None,
) -> tuple[list[Sample], list[Sample], CleaningReport]:
    """clean, split, then remove train samples that overlap eval. Returns (train, eval, report)
    with `report.input_count - report.removed == len(train) + len(eval)`. Raises SplitError
    (a 4xx for the caller) when nothing is left or the eval size cannot be met.

    `eval_samples` given (a dataset's eval files): they are the eval split, cleaned like the
    rest, and `samples` (which must not hold them) are train; no random split is made."""
    words = WordCache()
    if eval_samples is None:
        cleaned, report = clean(
            samples,
            cleaning,
            tokenizer=tokenizer,
            on_step=on_step,
            words=words,
            feedback_scores=feedback_scores,
        )
        train, eval_ = splitting.split(cleaned, split_options)
    else:
        train, eval_, report = _clean_given_eval(
            samples,
            eval_samples,
            cleaning,
            tokenizer=tokenizer,
            on_step=on_step,
            words=words,
            feedback_scores=feedback_scores,
        )
    if (n := cleaning.decontaminate_ngram) is not None:
        train, step = decontaminate(train, eval_, n, cleaning.decontaminate_max_df, words)
        report.add(step)
        if on_step is not None:
            on_step(step)
    report.train_count, report.eval_count = len(train), len(eval_)
    report.output_count = len(train) + len(eval_)
    return train, eval_, report


def _clean_given_eval(
    train_in: Sequence[Sample],
    eval_in: Sequence[Sample],
    cleaning: CleaningOptions,
    *,
    tokenizer: Any | None,
    on_step: OnStep | None,
    words: WordCache,
    feedback_scores: Mapping[str, float] | None,
) -> tuple[list[Sample], list[Sample], CleaningReport]:
    """Train and a given eval set, each cleaned on its own (a duplicate across the two must not
    cost eval an item: the train copy goes, below), then train samples asking an eval prompt
    removed, as the random split keeps a prompt on one side. Each step is reported once, for
    both sets together, so the report reads as a single pass."""
    train, train_report = clean(
        train_in, cleaning, tokenizer=tokenizer, words=words, feedback_scores=feedback_scores
    )
    eval_, eval_report = clean(
        eval_in, cleaning, tokenizer=tokenizer, words=words, feedback_scores=feedback_scores
    )
    if not eval_:
        raise splitting.SplitError(
            f"eval_file_ids: cleaning removed all {len(eval_in)} samples of the eval files"
        )
    report = CleaningReport(input_count=len(train_in) + len(eval_in))
    report.flagged = dict(Counter(train_report.flagged) + Counter(eval_report.flagged))
    report.pii = dict(Counter(train_report.pii) + Counter(eval_report.pii))
    for ours, theirs in zip(train_report.steps, eval_report.steps, strict=True):
        _report(report, _merged(ours, theirs), on_step)
    eval_prompts = {prompt_key(s) for s in eval_}
    kept = [s for s in train if prompt_key(s) not in eval_prompts]
    dropped = len(train) - len(kept)
    removed = Counter({"eval_prompt": dropped}) if dropped else Counter[str]()
    step = StepReport.of("eval_prompts", len(train) + len(eval_), removed)
    _report(report, step, on_step)
    if not kept:
        raise splitting.SplitError(
            "no train samples: the selection is empty once cleaned or every sample asks a "
            "prompt of the eval files"
        )
    return sorted(kept, key=lambda s: s.id), sorted(eval_, key=lambda s: s.id), report


def _merged(first: StepReport, second: StepReport) -> StepReport:
    reasons = Counter(first.reasons) + Counter(second.reasons)
    return StepReport(
        first.step,
        first.samples_in + second.samples_in,
        first.removed + second.removed,
        first.changed + second.changed,
        dict(sorted(reasons.items())),
    )


def _report(report: CleaningReport, step: StepReport, on_step: OnStep | None) -> None:
    report.add(step)
    if on_step is not None:
        on_step(step)
