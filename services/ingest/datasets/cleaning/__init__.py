"""The dataset cleaning pipeline: one module per kind of step, composed in `pipeline`.

Plain functions over `shared.chat.Sample` lists; no HTTP, no bus, so they are tested with plain
calls and reused by any caller (the dataset build worker, a CLI, a notebook).
"""

from services.ingest.datasets.cleaning.pipeline import OnStep, clean, clean_and_split
from services.ingest.datasets.cleaning.report import CleaningReport, StepReport
from services.ingest.datasets.cleaning.tokens import (
    TokenCounter,
    TokenizerLoadError,
    load_tokenizer,
)

__all__ = [
    "CleaningReport",
    "OnStep",
    "StepReport",
    "TokenCounter",
    "TokenizerLoadError",
    "clean",
    "clean_and_split",
    "load_tokenizer",
]
