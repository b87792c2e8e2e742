"""`{{item.x}}` / `{{sample.x}}` templating (services/evaluator/templating.py), the one the Evals
API's criteria and prompts and the LLM judge's grader messages share, as plain function calls:
references filled in once, values as text or sorted JSON, what is missing named, references
checked against the item schema, and the `sample` namespace."""

from __future__ import annotations

import pytest

from services.evaluator import templating


def test_references_are_filled_in_once_and_what_is_missing_is_named() -> None:
    item = {"q": "why", "tags": ["a", "b"], "n": 3, "meta": {"lang": "en"}, "x": "{{item.q}}"}
    assert templating.render("{{ item.q }}/{{item.tags}}/{{item.tags.1}}/{{item.n}}", {"item": item}) == (
        'why/["a", "b"]/b/3'
    )  # fmt: skip
    assert templating.render("{{item.meta.lang}}", {"item": item}) == "en"
    # A value is never expanded again; an object is JSON with sorted keys, whatever its order.
    assert templating.render("{{item.x}}", {"item": item}) == "{{item.q}}"
    context = {"item": {"o": {"b": 1, "a": [{"d": 2, "c": 3}]}}, "sample": {"output_text": "hi"}}
    assert templating.render("{{item.o}} {{sample.output_text}}", context) == (
        '{"a": [{"c": 3, "d": 2}], "b": 1} hi'
    )
    with pytest.raises(templating.TemplateError, match=r"item\.meta\.nope is not in this item"):
        templating.render("{{item.meta.nope}}", {"item": item})
    with pytest.raises(templating.TemplateError, match=r"item\.tags\.2 is not in this item"):
        templating.render("{{item.tags.2}}", {"item": item})
    with pytest.raises(
        templating.TemplateError, match=r"\{\{sample\.output_text\}\}: sample is not"
    ):
        templating.render("{{sample.output_text}}", {"item": item})
    with pytest.raises(templating.TemplateError, match="unknown namespace 'other'"):
        templating.render("{{other.x}}", {"item": item})


def test_references_are_checked_against_the_item_schema() -> None:
    templating.check("{{item.q}} {{sample.output_text}}", item_properties=["q"], sample=True)
    templating.check("{{item.anything.0}}", item_properties=None, sample=False)
    with pytest.raises(templating.TemplateError, match="has no property 'answr'"):
        templating.check("{{item.answr}}", item_properties=["answer"], sample=True)
    with pytest.raises(templating.TemplateError, match="no sample namespace"):
        templating.check("{{sample.output_text}}", item_properties=None, sample=False)
    with pytest.raises(templating.TemplateError, match="not a reference"):
        templating.check("{{answer}}", item_properties=None, sample=True)
    with pytest.raises(templating.TemplateError, match="in the input is not a reference"):
        templating.check("{{ item q }}", item_properties=None, sample=True, where="input")


def test_the_sample_namespace_has_output_text_and_output_json() -> None:
    given_sample = templating.sample_context({"output_text": '{"a": 1}'})
    assert given_sample["output_json"] == {"a": 1}
    generated = templating.sample_context(
        {"output": [{"role": "assistant", "content": "plain"}], "model": "m"}
    )
    assert generated["output_text"] == "plain"
    assert generated["output_json"] is None
    assert generated["output_tools"] == []
