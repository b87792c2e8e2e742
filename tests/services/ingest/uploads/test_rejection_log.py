"""The complete list of an upload's rejected lines (uploads.RejectionLog): every line the
report does not list is in it, stored as JSONL in real S3; with object storage away the upload
is not failed for it, and the local spool file goes either way."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import orjson
import pytest

from services.ingest.uploads.files import rejection_log, store_rejections
from services.ingest.uploads.formats import LineError
from shared.settings import S3Settings
from shared.storage import ObjectStore


def test_every_rejected_line_is_stored_as_jsonl(object_store: ObjectStore, tmp_path: Path) -> None:
    errors = [LineError(n, f"messages[{n}].role: bad", "openai_finetune") for n in range(1, 2501)]
    with rejection_log(tmp_path) as rejections:
        for error in errors:
            rejections.add(error)
        assert asyncio.run(store_rejections(rejections, object_store, "t/errors.jsonl"))
    stored = object_store.get_bytes("t/errors.jsonl").splitlines()
    assert [orjson.loads(line) for line in stored] == [
        {"line": e.line_number, "reason": e.reason, "format": "openai_finetune"} for e in errors
    ]
    assert list(tmp_path.iterdir()) == []  # the spool file is gone


def test_object_storage_away_leaves_the_upload_standing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    away = ObjectStore.from_settings(S3Settings(port=1))  # nothing listens there
    with caplog.at_level(logging.WARNING), rejection_log(tmp_path) as rejections:
        rejections.add(LineError(3, "not valid JSON"))
        assert asyncio.run(store_rejections(rejections, away, "t/errors.jsonl")) is False
    assert "could not be stored" in caplog.text
    assert "t/errors.jsonl" in caplog.text
    assert list(tmp_path.iterdir()) == []
