"""Tool calls read back from a model's text (the `<tool_call>` convention its training rendered),
and the CPU engine's answer to a request that offered tools, parsed by the official openai SDK."""

from __future__ import annotations

import json

from openai.types.chat import ChatCompletion

from services.hoster.completions import Completion
from shared.tool_calls import read_tool_calls


def test_calls_are_read_out_of_the_text_and_what_is_not_a_call_stays() -> None:
    text = (
        'Let me check.\n<tool_call>\n{"name": "lookup_order", "arguments": {"id": 42}}\n'
        '</tool_call>\n<tool_call>{"name": "notify", "arguments": "{\\"to\\": \\"ops\\"}"}'
        "</tool_call>"
    )
    content, calls = read_tool_calls(text)
    assert content == "Let me check."
    assert [c["function"]["name"] for c in calls] == ["lookup_order", "notify"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"id": 42}
    assert json.loads(calls[1]["function"]["arguments"]) == {"to": "ops"}
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)
    only = read_tool_calls('<tool_call>{"name": "ping", "arguments": {}}</tool_call>')
    assert only[0] is None
    broken = 'Sure <tool_call>{"name": oops}</tool_call> and <tool_call>{"x": 1}</tool_call>'
    assert read_tool_calls(broken) == (broken, [])
    assert read_tool_calls("plain answer") == ("plain answer", [])


def test_an_answer_to_a_request_with_tools_carries_tool_calls_the_sdk_reads() -> None:
    offered = Completion("chatcmpl-1", "ft:x", prompt=[1, 2], limit=16, tools=True)
    text = '<tool_call>{"name": "lookup_order", "arguments": {"id": 7}}</tool_call>'
    message, finish = offered.message(text, stopped=True)
    body = {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "ft:x",
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
    }  # fmt: skip
    parsed = ChatCompletion.model_validate(body)
    choice = parsed.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert choice.message.tool_calls is not None
    assert choice.message.tool_calls[0].function.name == "lookup_order"  # type: ignore[union-attr]
    # Without tools offered the text is the answer, as it was.
    plain = Completion("chatcmpl-2", "ft:x", prompt=[1], limit=16)
    assert plain.message(text, stopped=True) == (
        {"role": "assistant", "content": text, "refusal": None},
        "stop",
    )
