"""Chat rendering: assistant-only labels through the model's template, on the tiny ChatML
tokenizer and on the real SmolLM2 tokenizer (whose template has no tools support)."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from services.trainer.rendering import (
    CHATML_TOOLS_TEMPLATE,
    IGNORE_INDEX,
    Renderer,
    RenderError,
    TokenizedExample,
    serving_template,
)
from shared.chat import Sample, to_openai_messages

WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def make_sample(messages: list[dict[str, Any]], **extra: Any) -> Sample:
    return Sample.model_validate(
        {
            "tenant": "acme",
            "source": "upload",
            "created_at": datetime(2026, 1, 1, tzinfo=UTC),
            "messages": messages,
            **extra,
        }
    )


def multi_turn(**weights: int) -> Sample:
    first = {"role": "assistant", "content": "The capital of France is Paris."}
    if "first" in weights:
        first["weight"] = weights["first"]
    return make_sample(
        [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": "What is the capital of France?"},
            first,
            {"role": "user", "content": "And of Germany?"},
            {"role": "assistant", "content": "Berlin."},
        ]
    )


def tool_sample() -> Sample:
    return make_sample(
        [
            {"role": "user", "content": "What is the weather in Berlin?"},
            {
                "role": "assistant",
                "tool_calls": [
                    {"id": "c1", "name": "get_weather", "arguments": '{"city": "Berlin"}'}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "sunny, 21 degrees"},
            {"role": "assistant", "content": "It is sunny and 21 degrees in Berlin."},
        ],
        tools=[WEATHER_TOOL],
    )


def labelled_runs(example: TokenizedExample, tokenizer: PreTrainedTokenizerBase) -> list[str]:
    """The labelled target tokens, decoded, one string per contiguous run (one per message)."""
    runs: list[list[int]] = []
    previous = False
    for label in example.labels:
        current = label != IGNORE_INDEX
        if current and not previous:
            runs.append([])
        if current:
            runs[-1].append(label)
        previous = current
    return [tokenizer.decode(run) for run in runs]


def assert_shifted(example: TokenizedExample) -> None:
    assert len(example.input_ids) == len(example.labels)
    assert example.labels[-1] == IGNORE_INDEX
    for i, label in enumerate(example.labels[:-1]):
        assert label in (IGNORE_INDEX, example.input_ids[i + 1])


def test_multi_turn_labels_exactly_the_assistant_turns(tiny_tokenizer: Any) -> None:
    example = Renderer(tiny_tokenizer).render(multi_turn(), loss_on="all_assistant")

    assert_shifted(example)
    assert labelled_runs(example, tiny_tokenizer) == [
        "The capital of France is Paris.<|im_end|>",
        "Berlin.<|im_end|>",
    ]
    text = tiny_tokenizer.decode(example.input_ids)
    assert text.startswith("<|im_start|>system\nAnswer briefly.<|im_end|>\n<|im_start|>user\n")
    assert example.num_label_tokens == sum(
        len(tiny_tokenizer(run, add_special_tokens=False)["input_ids"])
        for run in labelled_runs(example, tiny_tokenizer)
    )


def test_tool_call_and_result_turns(tiny_tokenizer: Any) -> None:
    example = Renderer(tiny_tokenizer).render(tool_sample(), loss_on="all_assistant")

    assert_shifted(example)
    assert labelled_runs(example, tiny_tokenizer) == [
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Berlin"}}\n</tool_call>'
        "<|im_end|>",
        "It is sunny and 21 degrees in Berlin.<|im_end|>",
    ]
    text = tiny_tokenizer.decode(example.input_ids)
    # The tool schema and the tool's result are context, rendered but never trained on.
    assert '"name": "get_weather", "description": "Current weather of a city"' in text
    assert "<|im_start|>tool\nsunny, 21 degrees<|im_end|>" in text


def test_last_assistant_trains_the_final_turn_only(tiny_tokenizer: Any) -> None:
    example = Renderer(tiny_tokenizer).render(multi_turn(), loss_on="last_assistant")

    assert labelled_runs(example, tiny_tokenizer) == ["Berlin.<|im_end|>"]
    assert "Paris" in tiny_tokenizer.decode(example.input_ids)  # still there as context


def test_weight_zero_turn_gets_no_loss(tiny_tokenizer: Any) -> None:
    example = Renderer(tiny_tokenizer).render(multi_turn(first=0), loss_on="all_assistant")

    assert labelled_runs(example, tiny_tokenizer) == ["Berlin.<|im_end|>"]


def test_messages_after_the_last_trained_turn_are_left_out(tiny_tokenizer: Any) -> None:
    sample = make_sample(
        [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "Unanswered question"},
        ]
    )
    example = Renderer(tiny_tokenizer).render(sample, loss_on="all_assistant")

    assert "Unanswered" not in tiny_tokenizer.decode(example.input_ids)
    assert labelled_runs(example, tiny_tokenizer) == ["Hello!<|im_end|>"]


@pytest.mark.parametrize(
    ("messages", "loss_on"),
    [
        ([{"role": "user", "content": "Hi"}], "all_assistant"),
        (
            [
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello!", "weight": 0},
            ],
            "last_assistant",
        ),
    ],
)
def test_sample_without_trainable_assistant_turn_is_refused(
    tiny_tokenizer: Any, messages: list[dict[str, Any]], loss_on: Any
) -> None:
    sample = make_sample(messages)
    with pytest.raises(RenderError, match=f"sample {sample.id}: has no assistant") as caught:
        Renderer(tiny_tokenizer).render(sample, loss_on=loss_on)
    assert caught.value.reason == "no_assistant"


def test_truncation_keeps_the_prompt_start(tiny_tokenizer: Any) -> None:
    full = Renderer(tiny_tokenizer).render(multi_turn(), loss_on="all_assistant")
    limit = len(full) - 3  # cuts into the last answer

    cut = Renderer(tiny_tokenizer).render(multi_turn(), loss_on="all_assistant", max_seq_len=limit)

    assert cut.truncated
    assert not full.truncated
    assert cut.input_ids == full.input_ids[:limit]
    assert cut.labels == [*full.labels[: limit - 1], IGNORE_INDEX]


def test_truncation_without_label_tokens_left_is_refused(tiny_tokenizer: Any) -> None:
    sample = multi_turn()
    with pytest.raises(RenderError, match="no assistant token within max_seq_len=8") as caught:
        Renderer(tiny_tokenizer).render(sample, loss_on="all_assistant", max_seq_len=8)
    assert caught.value.reason == "too_long"


def test_media_content_is_refused_naming_the_message(tiny_tokenizer: Any) -> None:
    image = {"type": "image", "url": "https://example.com/cat.png"}
    sample = make_sample(
        [
            {"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]},
            {"role": "assistant", "content": "A cat."},
        ]
    )
    with pytest.raises(RenderError, match=r"messages\[0\] has image content") as caught:
        Renderer(tiny_tokenizer).render(sample, loss_on="all_assistant")
    assert caught.value.reason == "media"


def test_template_that_rewrites_earlier_turns_is_refused(tiny_tokenizer: Any) -> None:
    tokenizer = copy.deepcopy(tiny_tokenizer)
    # Like templates that drop the reasoning of earlier turns: history renders differently.
    tokenizer.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
        "{% if not loop.last %} (earlier){% endif %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    with pytest.raises(RenderError, match=r"messages\[2\]: the template does not render") as caught:
        Renderer(tokenizer).render(multi_turn(), loss_on="all_assistant")
    assert caught.value.reason == "prefix_unstable"


def test_tool_sample_fails_for_a_non_chatml_template_without_tools(tiny_tokenizer: Any) -> None:
    tokenizer = copy.deepcopy(tiny_tokenizer)
    tokenizer.chat_template = (
        "{% for m in messages %}[{{ m.role }}] {{ m.content }}<|endoftext|>{% endfor %}"
        "{% if add_generation_prompt %}[assistant] {% endif %}"
    )
    with pytest.raises(RenderError, match="cannot render tools") as caught:
        Renderer(tokenizer).render(tool_sample(), loss_on="all_assistant")
    assert caught.value.reason == "no_tool_support"


@pytest.fixture(scope="module")
def smollm2_tokenizer(smollm2_dir: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(smollm2_dir)


def test_smollm2_renders_tool_samples_with_the_chatml_tools_fallback(
    smollm2_tokenizer: PreTrainedTokenizerBase,
) -> None:
    example = Renderer(smollm2_tokenizer).render(tool_sample(), loss_on="all_assistant")

    assert_shifted(example)
    assert labelled_runs(example, smollm2_tokenizer) == [
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Berlin"}}\n</tool_call>'
        "<|im_end|>",
        "It is sunny and 21 degrees in Berlin.<|im_end|>",
    ]
    expected = smollm2_tokenizer.apply_chat_template(
        [
            {"role": "user", "content": "What is the weather in Berlin?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": {"city": "Berlin"}},
                    }
                ],
            },
            {"role": "tool", "content": "sunny, 21 degrees"},
            {"role": "assistant", "content": "It is sunny and 21 degrees in Berlin."},
        ],
        tools=[{"type": "function", "function": WEATHER_TOOL}],
        chat_template=CHATML_TOOLS_TEMPLATE,
        tokenize=False,
    )
    assert smollm2_tokenizer.decode(example.input_ids) == expected.rstrip("\n")


def test_smollm2_renders_plain_chats_with_its_own_template(
    smollm2_tokenizer: PreTrainedTokenizerBase,
) -> None:
    sample = make_sample(
        [
            {"role": "user", "content": "What is the capital of France?"},
            {"role": "assistant", "content": "Paris."},
            {"role": "user", "content": "And of Germany?"},
            {"role": "assistant", "content": "Berlin."},
        ]
    )
    example = Renderer(smollm2_tokenizer).render(sample, loss_on="all_assistant")

    assert_shifted(example)
    assert labelled_runs(example, smollm2_tokenizer) == ["Paris.<|im_end|>", "Berlin.<|im_end|>"]
    # SmolLM2's own template adds its default system prompt.
    assert "named SmolLM" in smollm2_tokenizer.decode(example.input_ids)


def test_the_serving_template_renders_as_training_did(
    smollm2_tokenizer: PreTrainedTokenizerBase,
) -> None:
    # The artifact's tokenizer carries serving_template: a model trained on tool samples with
    # the fallback must see the same text at inference, and plain chats keep SmolLM2's own.
    served = copy.copy(smollm2_tokenizer)
    served.chat_template = serving_template(smollm2_tokenizer)
    plain = make_sample(
        [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello."}]
    )
    for sample in (tool_sample(), plain):
        trained = smollm2_tokenizer.decode(
            Renderer(smollm2_tokenizer).render(sample, loss_on="all_assistant").input_ids
        )
        record = to_openai_messages(sample)
        for message in record["messages"]:
            for call in message.get("tool_calls", []):
                call["function"]["arguments"] = json.loads(call["function"]["arguments"])
        rendered = served.apply_chat_template(
            record["messages"], tools=record.get("tools"), tokenize=False
        )
        assert rendered.rstrip("\n") == trained
    assert serving_template(copy.copy(smollm2_tokenizer)) != smollm2_tokenizer.chat_template


def test_token_across_the_start_of_an_answer_is_refused(tiny_tokenizer: Any) -> None:
    tokenizer = copy.deepcopy(tiny_tokenizer)
    # The answer header ends in "ca": with the answer "pital" the text holds a token "ap" that
    # the model could never produce after a prompt ending in "ca".
    tokenizer.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n"
        "{% if m.role == 'assistant' %}ca{% endif %}{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\nca{% endif %}"
    )
    sample = make_sample(
        [{"role": "user", "content": "What?"}, {"role": "assistant", "content": "pital"}]
    )
    offsets = tokenizer("capital", return_offsets_mapping=True)["offset_mapping"]
    assert 2 not in [start for start, _ in offsets]  # no token starts after "ca"

    with pytest.raises(RenderError, match="a token crosses the edge") as caught:
        Renderer(tokenizer).render(sample, loss_on="all_assistant")
    assert caught.value.reason == "prefix_unstable"
