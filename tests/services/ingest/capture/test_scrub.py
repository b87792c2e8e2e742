"""Secrets pasted into prompts never reach a stored sample."""

from datetime import UTC, datetime

from services.ingest.capture.scrub import scrub_secrets
from shared.chat import ImagePart, Message, ReasoningBlock, Sample, TextPart, ToolCall

KEY = "sk-proj-" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6"


def _sample(*messages: Message) -> Sample:
    return Sample(
        tenant="acme", source="gateway", created_at=datetime.now(UTC), messages=list(messages)
    )


def test_keys_in_text_arguments_and_reasoning_are_redacted() -> None:
    sample = _sample(
        Message(role="user", content=f"why does curl -H 'Authorization: Bearer {KEY}' fail?"),
        Message(
            role="assistant",
            content="Let me check.",
            tool_calls=[ToolCall(id="c1", name="http", arguments={"headers": {"x-api-key": KEY}})],
            reasoning=[ReasoningBlock(text=f"the user pasted {KEY}")],
        ),
    )
    scrubbed = scrub_secrets(sample).to_json_bytes().decode()
    assert KEY not in scrubbed
    assert "[REDACTED]" in scrubbed
    assert "why does curl" in scrubbed


def test_a_clean_sample_is_returned_unchanged() -> None:
    sample = _sample(
        Message(role="user", content="How many tokens is this?"),
        Message(role="assistant", content="5"),
    )
    assert scrub_secrets(sample) is sample


def test_only_the_parts_holding_a_secret_change() -> None:
    image = ImagePart(url="https://example.com/a.png")
    sample = _sample(
        Message(
            role="user",
            content=[
                TextPart(text="clean"),
                image,
                TextPart(text=f"key {KEY}"),
                TextPart(text="x"),
            ],
        ),
        Message(
            role="assistant",
            tool_calls=[
                ToolCall(id="c1", name="f", arguments={"a": 1}),
                ToolCall(id="c2", name="g", arguments={"key": KEY}),
            ],
            reasoning=[ReasoningBlock(text="fine"), ReasoningBlock(text=KEY)],
        ),
    )
    scrubbed = scrub_secrets(sample)
    user, assistant = scrubbed.messages
    assert [getattr(p, "text", None) for p in user.content] == [
        "clean",
        None,
        "key [REDACTED]",
        "x",
    ]
    assert user.content[0] is sample.messages[0].content[0]
    assert user.content[1] is image
    assert [c.arguments for c in assistant.tool_calls] == ['{"a": 1}', '{"key": "[REDACTED]"}']
    assert [b.text for b in assistant.reasoning] == ["fine", "[REDACTED]"]
    assert sample.messages[1].reasoning[1].text == KEY  # the original is left as it was
