"""A run's items: inline (`file_content`), an uploaded file (`file-...`), a built dataset's eval
split (`ds_...`) or an eval set's version (`evs_...` its latest, `evs_...@N` version N), the last
three read from ingest's HTTP API with the caller's own key (as the scheduler reads them), so
ingest decides whose they are. Every item is checked against the eval's item schema before the
run is accepted; the first items that do not match are named. An eval set read without a version
(its latest) is named with the version it was (`evs_...@N`, from ingest's answer), so the run
records which items it read: a later refresh changes what `evs_...` alone reads.

A file's line is `{"item": {...}, "sample": {...}}` (`sample` optional) or the item itself. A
dataset's or eval set's sample becomes `{"messages": <its turns before the last>, "reference":
<the last assistant turn's text>}`, with `tools` and `reference_tool_calls` when it has them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import httpx
import jsonschema_rs

from services.evaluator.evals.errors import EvalsError

DATASET_PREFIX = "ds_"
EVAL_SET_PREFIX = "evs_"
# An eval set id, and a version number after `@` (none: the latest).
_EVAL_SET = re.compile(r"(evs_[0-9A-Za-z]{1,36})(?:@([1-9][0-9]{0,8}))?")
FILE_PREFIX = "file-"
# Ingest's upload purpose for eval items (services/ingest/uploads/eval_files.py): checked line by line.
EVALS_PURPOSE = "evals"
SOURCE_ID = "data_source.source.id"
# The version ingest served (services/ingest/eval_sets/routes.py), `latest` resolved.
EVAL_SET_VERSION_HEADER = "x-tuneloop-eval-set-version"
_ERRORS_NAMED = 3


@dataclass(frozen=True)
class Row:
    item: dict[str, Any]
    sample: dict[str, Any] | None = None


@dataclass(frozen=True)
class Read:
    """A source's items and its id as the run records it: as given, or an eval set's pinned to
    the version read (`evs_...@N`)."""

    rows: list[Row]
    source_id: str


def compile_schema(schema: dict[str, Any], param: str) -> jsonschema_rs.Validator:
    """The item schema's validator; refused (naming `param`) when it is not a JSON schema.
    Nothing is fetched: a `$ref` outside the schema is an error, not a request."""
    try:
        return jsonschema_rs.validator_for(schema, offline=True)
    except (ValueError, jsonschema_rs.ReferencingError) as exc:
        message = getattr(exc, "message", str(exc)).splitlines()[0]
        raise EvalsError(422, f"{param}: not a JSON schema: {message}", param=param) from None


def check_items(
    rows: list[Row], validator: jsonschema_rs.Validator, *, param: str, label: str
) -> None:
    """Every row's item against the schema; the first few that do not match are named, as
    `<label>[<index>]/<path in the item>`."""
    problems = []
    for index, row in enumerate(rows):
        error = next(iter(validator.iter_errors(row.item)), None)
        if error is not None:
            where = "".join(f"/{part}" for part in error.instance_path)
            problems.append(f"{label}[{index}]{where}: {error.message}")
            if len(problems) == _ERRORS_NAMED:
                break
    if problems:
        raise EvalsError(
            422, "items do not match the eval's item_schema: " + "; ".join(problems), param=param
        )


def _line_row(value: Any, where: str) -> Row:
    if not isinstance(value, dict):
        raise EvalsError(422, f"{where}: not a JSON object", param=SOURCE_ID)
    if isinstance(value.get("item"), dict) and set(value) <= {"item", "sample"}:
        sample = value.get("sample")
        if sample is not None and not isinstance(sample, dict):
            raise EvalsError(422, f"{where}: sample is not a JSON object", param=SOURCE_ID)
        return Row(value["item"], sample)
    return Row(value)


def _dataset_row(value: Any, where: str) -> Row | None:
    """A sample ending with an assistant turn as an item; others are left out (nothing to
    compare an answer with)."""
    messages = value.get("messages") if isinstance(value, dict) else None
    if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict):
        raise EvalsError(422, f"{where}: not a chat sample", param=SOURCE_ID)
    last = messages[-1]
    if last.get("role") != "assistant" or len(messages) < 2:
        return None
    content = last.get("content")
    if isinstance(content, list):
        content = "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    item: dict[str, Any] = {"messages": messages[:-1], "reference": content or ""}
    if value.get("tools"):
        item["tools"] = value["tools"]
    if last.get("tool_calls"):
        item["reference_tool_calls"] = last["tool_calls"]
    return Row(item)


def _chat_rows(body: bytes, what: str) -> list[Row]:
    rows = [_dataset_row(value, where) for where, value in _jsonl(body, what)]
    return [row for row in rows if row is not None]


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _jsonl(body: bytes, what: str) -> list[tuple[str, Any]]:
    lines = []
    for number, line in enumerate(body.splitlines(), 1):
        if not line.strip():
            continue
        try:
            lines.append((f"{what} line {number}", json.loads(line, parse_constant=_no_constant)))
        except ValueError as exc:
            raise EvalsError(
                422, f"{what} line {number}: not JSON ({exc})", param=SOURCE_ID
            ) from None
    return lines


class IngestReader:
    """Uploaded files and datasets, asked of ingest with the caller's credentials."""

    def __init__(self, client: httpx.AsyncClient, base_url: str, *, max_bytes: int) -> None:
        self.client, self.base_url, self.max_bytes = client, base_url.rstrip("/"), max_bytes

    async def read(self, ident: str, headers: dict[str, str]) -> Read:
        if ident.startswith(DATASET_PREFIX):
            return Read(await self._dataset(ident, headers), ident)
        if ident.startswith(EVAL_SET_PREFIX):
            return await self._eval_set(ident, headers)
        if ident.startswith(FILE_PREFIX):
            return Read(await self._file(ident, headers), ident)
        raise EvalsError(
            422,
            f"{SOURCE_ID}: {ident!r} is not an uploaded file (file-...), a dataset (ds_...) or "
            "an eval set (evs_... or evs_...@<version>)",
            param=SOURCE_ID,
        )

    async def _file(self, ident: str, headers: dict[str, str]) -> list[Row]:
        """An uploaded file's lines. One of purpose `evals` that ingest found a bad line in is
        refused with ingest's words (they name the line); one not checked yet is read as any."""
        described, _ = await self._get(f"/v1/files/{ident}", headers, ident)
        found = json.loads(described)
        if found.get("purpose") == EVALS_PURPOSE and found.get("status") == "error":
            raise EvalsError(
                422, f"{SOURCE_ID}: {ident}: {found.get('status_details')}", param=SOURCE_ID
            )
        body, _ = await self._get(f"/v1/files/{ident}/content", headers, ident)
        return [_line_row(value, where) for where, value in _jsonl(body, ident)]

    async def _dataset(self, ident: str, headers: dict[str, str]) -> list[Row]:
        body, _ = await self._get(f"/v1/datasets/{ident}/export?split=eval", headers, ident)
        return _chat_rows(body, f"{ident} eval split")

    async def _eval_set(self, ident: str, headers: dict[str, str]) -> Read:
        named = _EVAL_SET.fullmatch(ident)
        if named is None:
            raise EvalsError(
                422,
                f"{SOURCE_ID}: {ident!r} is not an eval set id (evs_...) with an optional "
                "version (evs_...@<version>, a number from 1)",
                param=SOURCE_ID,
            )
        # Ingest serves a version as it exports a dataset's split: OpenAI chat lines.
        path = f"/v1/eval_sets/{named[1]}/versions/{named[2] or 'latest'}/content"
        body, answered = await self._get(path, headers, ident)
        version = named[2] or answered.get(EVAL_SET_VERSION_HEADER, "")
        if not version.isdigit():
            raise EvalsError(
                502, f"{SOURCE_ID}: ingest did not say which version of {named[1]} it served",
                param=SOURCE_ID, code="bad_gateway",
            )  # fmt: skip
        return Read(_chat_rows(body, ident), f"{named[1]}@{version}")

    async def _get(
        self, path: str, headers: dict[str, str], ident: str
    ) -> tuple[bytes, httpx.Headers]:
        """The body (at most `max_bytes`) and the answer's headers."""
        try:
            async with self.client.stream("GET", self.base_url + path, headers=headers) as answer:
                if answer.status_code != 200:
                    await answer.aread()
                    raise _refused(answer, ident)
                chunks, size = [], 0
                async for chunk in answer.aiter_bytes():
                    size += len(chunk)
                    if size > self.max_bytes:
                        raise EvalsError(
                            413,
                            f"{SOURCE_ID}: {ident} is over {self.max_bytes} bytes, the most a "
                            "run reads (TUNELOOP_EVALUATOR_EVALS_MAX_FILE_BYTES)",
                            param=SOURCE_ID,
                        )
                    chunks.append(chunk)
                answered = answer.headers
        except httpx.HTTPError as exc:
            raise EvalsError(
                503, f"{SOURCE_ID}: ingest is not reachable ({type(exc).__name__})",
                param=SOURCE_ID, code="unavailable",
            ) from None  # fmt: skip
        return b"".join(chunks), answered


def _refused(answer: httpx.Response, ident: str) -> EvalsError:
    try:
        detail = answer.json().get("detail")
    except (ValueError, AttributeError):
        detail = answer.text[:300]
    status = answer.status_code if answer.status_code in (403, 404, 409, 422) else 422
    return EvalsError(status, f"{SOURCE_ID}: {ident}: {detail}", param=SOURCE_ID)
