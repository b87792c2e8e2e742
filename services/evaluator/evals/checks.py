"""What the Evals API checks before it accepts an eval or a run: kinds it runs, item schemas,
templates that name what the items have, prompts it can send, JSON it can write back. Each
refusal is an EvalsError naming the field (OpenAI's `param`)."""

from __future__ import annotations

import json
from typing import Any

from services.evaluator import templating
from services.evaluator.evals import model_graders, protocol, sources, store
from services.evaluator.evals.errors import EvalsError, unsupported
from services.evaluator.evals.generation import PART_TYPES, TEXT_PARTS
from services.evaluator.models import EvalsEvalRow

REFUSED_METRICS = {"cosine": "an embedding model", "meteor": "WordNet"}


# --- checking an eval -------------------------------------------------------------------------


def item_properties(item_schema: dict[str, Any]) -> list[str] | None:
    properties = item_schema.get("properties")
    return list(properties) if isinstance(properties, dict) else None


def _check_template(text: str, param: str, properties: list[str] | None, sample: bool) -> None:
    try:
        templating.check(text, item_properties=properties, sample=sample, where=param)
    except templating.TemplateError as exc:
        raise EvalsError(422, f"{param}: {exc}", param=param) from None


def _check_criterion(
    index: int, criterion: Any, properties: list[str] | None, sample: bool
) -> None:
    where = f"testing_criteria[{index}]"
    if isinstance(criterion, protocol.OtherGrader):
        raise unsupported(f"{where}.type", f"a {criterion.type!r} grader (it would run code)")
    if isinstance(criterion, protocol.ScoreModel | protocol.LabelModel):
        grader = model_graders.to_grader(criterion, where)
        for j, message in enumerate(grader.input):
            param = f"{where}.input[{j}].content"
            _check_template(message.text(), param, properties, sample)
        return
    if isinstance(criterion, protocol.TextSimilarity) and (
        needs := REFUSED_METRICS.get(criterion.evaluation_metric)
    ):
        raise unsupported(
            f"{where}.evaluation_metric", f"{criterion.evaluation_metric!r} (it needs {needs})"
        )
    for field in ("input", "reference"):
        _check_template(getattr(criterion, field), f"{where}.{field}", properties, sample)


def check_writable(value: Any, param: str) -> None:
    """JSON has no NaN or Infinity, which Python's parser reads: refused, never echoed back."""
    try:
        json.dumps(value, allow_nan=False)
    except ValueError:
        raise EvalsError(
            422, f"{param}: holds a number JSON cannot write (NaN or Infinity)", param=param
        ) from None


def check_eval(body: protocol.EvalCreate) -> protocol.CustomConfig:
    config = body.data_source_config
    if isinstance(config, protocol.OtherConfig):
        raise unsupported("data_source_config.type", f"a {config.type!r} data source config")
    param = "data_source_config.item_schema"
    check_writable(config.item_schema, param)
    for index, criterion in enumerate(body.testing_criteria):
        check_writable(criterion.model_dump(mode="json"), f"testing_criteria[{index}]")
    sources.compile_schema(config.item_schema, param)
    if config.item_schema.get("type", "object") != "object":
        raise EvalsError(422, f"{param}: items are JSON objects; its type must be 'object'",
                         param=param)  # fmt: skip
    properties = item_properties(config.item_schema)
    names: set[str] = set()
    for index, criterion in enumerate(body.testing_criteria):
        _check_criterion(index, criterion, properties, config.include_sample_schema)
        name = str(getattr(criterion, "name", ""))
        if name in names:
            param = f"testing_criteria[{index}].name"
            raise EvalsError(422, f"{param}: {name!r} names another criterion too", param=param)
        names.add(name)
    return config


# --- checking a run ---------------------------------------------------------------------------


def uses_sample(criteria: list[dict[str, Any]]) -> bool:
    return any(ref.startswith("sample") for ref in templating.references(json.dumps(criteria)))


def judged(criteria: list[dict[str, Any]]) -> bool:
    return any(c.get("type") in model_graders.RESULT_TYPES for c in criteria)


def check_messages(source: protocol.CompletionsDataSource, properties: list[str] | None) -> None:
    if source.model is None:
        raise EvalsError(422, "data_source.model: required: the model that answers each item",
                         param="data_source.model")  # fmt: skip
    messages = source.input_messages
    if messages is None:
        param = "data_source.input_messages"
        raise EvalsError(422, f"{param}: required: a template or an item_reference", param=param)
    if isinstance(messages, protocol.ItemReference):
        param = "data_source.input_messages.item_reference"
        _check_template("{{" + messages.item_reference + "}}", param, properties, False)
        return
    for i, message in enumerate(messages.template):
        where = f"data_source.input_messages.template[{i}].content"
        if isinstance(message.content, str):
            _check_template(message.content, where, properties, False)
            continue
        for j, part in enumerate(message.content):
            kind = part.get("type")
            field = "text" if kind in TEXT_PARTS else "image_url"
            if kind not in PART_TYPES or not isinstance(part.get(field), str):
                param = f"{where}[{j}]"
                raise EvalsError(
                    422, f"{param}: a part is {{type: input_text|output_text, text}} or "
                    "{type: input_image, image_url}", param=param,
                )  # fmt: skip
            _check_template(part[field], f"{where}[{j}].{field}", properties, False)


def check_rows(
    rows: list[sources.Row],
    eval_row: EvalsEvalRow,
    body: protocol.RunCreate,
    *,
    param: str,
    label: str,
    max_items: int,
) -> None:
    """A run's items: some, not too many, each matching the item schema, and each with its
    sample when a jsonl run's criteria read one."""
    if not rows:
        raise EvalsError(422, f"{param}: no items to evaluate", param=param)
    if len(rows) > max_items:
        raise EvalsError(
            413, f"{param}: {len(rows)} items; a run takes at most {max_items} "
            "(TUNELOOP_EVALUATOR_EVALS_MAX_ITEMS)", param=param,
        )  # fmt: skip
    config = store.loads(eval_row.data_source_config)
    validator = sources.compile_schema(config["item_schema"], "data_source_config.item_schema")
    sources.check_items(rows, validator, param=param, label=label)
    criteria = store.loads(eval_row.testing_criteria)
    if isinstance(body.data_source, protocol.JsonlDataSource) and uses_sample(criteria):
        missing = next((i for i, row in enumerate(rows) if row.sample is None), None)
        if missing is not None:
            raise EvalsError(
                422, f"{label}[{missing}].sample: required: the testing criteria read "
                "{{sample...}} and a jsonl run brings its own samples (or use a completions "
                "data source, where a model answers)", param=param,
            )  # fmt: skip
