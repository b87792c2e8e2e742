"""Canonical samples -> token ids with labels, through the model's own chat template.

Labels mark assistant tokens only. We do not rely on `{% generation %}` markers (most templates,
SmolLM2's included, lack them); instead each assistant message's text is located by rendering
the conversation up to it twice (with the generation prompt, then with the message) and checking
that every rendering is a prefix of the next. One tokenisation of the whole text with offsets
then says which tokens fall inside those spans.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any, Literal

import orjson
from transformers import PreTrainedTokenizerBase

from shared.chat import ExportError, Message, Sample, to_openai_messages

IGNORE_INDEX = -100
LossOn = Literal["all_assistant", "last_assistant"]

# ChatML with the Hermes/Qwen tool convention (tool schemas in the system turn, calls as
# <tool_call> JSON, results as a `tool` turn): what vLLM's `hermes` tool parser reads back. Used
# for samples with tools when a ChatML model's own template cannot render them (SmolLM2).
# transformers renders with trim_blocks, so newlines right after a {% %} tag are {{ '\n' }}.
CHATML_TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "You may call these tools:\n<tools>"
    "{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}"
    "{{ '\\n' }}</tools><|im_end|>\n"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if not (tools and loop.first and message.role == 'system') %}"
    "<|im_start|>{{ message.role }}\n"
    "{% if message.content %}{{ message.content }}{% endif %}"
    "{% for call in message.tool_calls or [] %}"
    "{% set fn = call.function if call.function is defined else call %}"
    "{% if not loop.first or message.content %}{{ '\\n' }}{% endif %}"
    '<tool_call>\n{"name": "{{ fn.name }}", "arguments": '
    "{% if fn.arguments is string %}{{ fn.arguments }}"
    "{% else %}{{ fn.arguments | tojson }}{% endif %}"
    "}\n</tool_call>"
    "{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_PROBE_TOOL, _PROBE_CALL = "tuneloop_probe_tool", "tuneloop_probe_call"


class RenderError(ValueError):
    """A sample cannot become a training example; `reason` is a short code the loader counts."""

    def __init__(self, sample_id: str, reason: str, detail: str) -> None:
        super().__init__(f"sample {sample_id}: {detail}")
        self.sample_id, self.reason = sample_id, reason


@dataclass(frozen=True)
class TokenizedExample:
    input_ids: list[int]
    # ALREADY SHIFTED: labels[i] is the target for the token after input_ids[i]; -100 = no loss.
    # The last position is always -100, so packed examples never predict their neighbour.
    labels: list[int]
    sample_id: str
    truncated: bool = False

    def __post_init__(self) -> None:
        if len(self.input_ids) != len(self.labels) or not self.input_ids:
            raise ValueError(
                f"sample {self.sample_id}: input_ids and labels must be non-empty, same length"
            )
        if self.labels[-1] != IGNORE_INDEX:
            raise ValueError(f"sample {self.sample_id}: the last label must be {IGNORE_INDEX}")

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def num_label_tokens(self) -> int:
        return sum(1 for label in self.labels if label != IGNORE_INDEX)


class Renderer:
    """Renders samples with one tokenizer; finds out once whether its template renders tools."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        if not tokenizer.is_fast:
            raise TypeError("rendering needs a fast tokenizer (character offsets of tokens)")
        if tokenizer.chat_template is None:
            raise ValueError("the tokenizer has no chat template")
        self.tokenizer = tokenizer
        self.tools_template = _tools_template(tokenizer)

    def render(
        self, sample: Sample, *, loss_on: LossOn, max_seq_len: int | None = None
    ) -> TokenizedExample:
        trained = _trained_messages(sample, loss_on)
        # Messages after the last trained one add tokens without loss: leave them out.
        messages = sample.messages[: trained[-1] + 1]
        record = _chat_record(sample, messages)
        template = self._template_for(sample, record)
        text, spans = self._render_spans(sample.id, record, trained, template)
        input_ids, labels = self._label_tokens(sample.id, text, spans)
        return _finish(sample.id, input_ids, labels, max_seq_len)

    def _template_for(self, sample: Sample, record: dict[str, Any]) -> str | None:
        """None: the model's own template. Tool samples may need our fallback, or cannot render."""
        uses_tools = bool(record.get("tools")) or any(
            m["role"] == "tool" or "tool_calls" in m for m in record["messages"]
        )
        if not uses_tools or self.tools_template == "native":
            return None
        if self.tools_template is None:
            raise RenderError(
                sample.id, "no_tool_support", "the model's chat template cannot render tools"
            )
        return self.tools_template

    def _render(
        self, sample_id: str, record: dict[str, Any], stop: int, *, gen: bool, template: str | None
    ) -> str:
        messages = record["messages"][:stop]
        if not messages:
            raise RenderError(sample_id, "template", "an assistant message has no prompt before it")
        try:
            text = self.tokenizer.apply_chat_template(
                messages,
                tools=record.get("tools"),
                chat_template=template,
                add_generation_prompt=gen,
                tokenize=False,
            )
        except Exception as exc:  # Jinja raises whatever the template's author chose.
            raise RenderError(sample_id, "template", f"chat template failed: {exc}") from None
        return str(text)

    def _render_spans(
        self, sample_id: str, record: dict[str, Any], trained: list[int], template: str | None
    ) -> tuple[str, list[tuple[int, int]]]:
        """The full text and the character span of every trained assistant message."""
        full = self._render(sample_id, record, trained[-1] + 1, gen=False, template=template)
        spans = []
        for k in trained:
            prompt = self._render(sample_id, record, k, gen=True, template=template)
            last = k == trained[-1]
            upto = (
                full
                if last
                else self._render(sample_id, record, k + 1, gen=False, template=template)
            )
            if not (upto.startswith(prompt) and full.startswith(upto)):
                raise RenderError(
                    sample_id,
                    "prefix_unstable",
                    f"messages[{k}]: the template does not render the conversation up to it as a "
                    "prefix of the whole (it rewrites earlier turns)",
                )
            spans.append((len(prompt), self._span_end(prompt, upto)))
        return full, spans

    def _span_end(self, prompt: str, upto: str) -> int:
        """End of the message's text: through the end-of-turn token, without the newline after
        it (generation stops at the eos token, so the model never produces that newline)."""
        eos = self.tokenizer.eos_token
        body = upto[len(prompt) :].rstrip()
        if isinstance(eos, str) and eos and body.endswith(eos):
            return len(prompt) + len(body)
        return len(upto)

    def _label_tokens(
        self, sample_id: str, text: str, spans: list[tuple[int, int]]
    ) -> tuple[list[int], list[int]]:
        """Token ids of the text and (unshifted) labels: the id where a token starts in a span."""
        encoding = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids: list[int] = encoding["input_ids"]
        offsets: list[tuple[int, int]] = encoding["offset_mapping"]
        starts = [start for start, _ in offsets]  # non-decreasing: bisect finds the spans
        ends = {end for _, end in offsets}
        labels = [IGNORE_INDEX] * len(ids)
        for begin, end in spans:
            first, stop = bisect.bisect_left(starts, begin), bisect.bisect_left(starts, end)
            # A token across a span edge would be split differently when the model generates.
            if first == len(starts) or starts[first] != begin or end not in ends:
                raise RenderError(
                    sample_id,
                    "prefix_unstable",
                    f"a token crosses the edge of an assistant message (characters {begin}-{end})",
                )
            labels[first:stop] = ids[first:stop]
        # Tokens after the last trained message (the template's trailing newline) carry no loss.
        keep = bisect.bisect_left(starts, spans[-1][1])
        return ids[:keep], labels[:keep]


def _trained_messages(sample: Sample, loss_on: LossOn) -> list[int]:
    """Indices of the assistant messages that get loss; RenderError when there are none."""
    assistant = [i for i, m in enumerate(sample.messages) if m.role == "assistant"]
    if loss_on == "last_assistant":
        assistant = assistant[-1:]
    trained = [i for i in assistant if sample.messages[i].weight != 0]
    if not trained:
        why = (
            "has no assistant message"
            if not assistant
            else "has no assistant message with weight 1"
        )
        raise RenderError(sample.id, "no_assistant", f"{why} to train on ({loss_on})")
    return trained


def _chat_record(sample: Sample, messages: list[Message]) -> dict[str, Any]:
    """The messages (and tools) in the dict shape Hugging Face chat templates expect."""
    view = sample.model_copy(update={"messages": messages})
    try:
        record = to_openai_messages(view)
    except ExportError as exc:
        raise RenderError(sample.id, "export", str(exc)) from None
    for i, (message, out) in enumerate(zip(messages, record["messages"], strict=True)):
        if not isinstance(out.get("content", ""), str):
            kinds = sorted({part.type for part in message.content if part.type != "text"})
            raise RenderError(
                sample.id,
                "media",
                f"messages[{i}] has {', '.join(kinds)} content; this trainer renders text only",
            )
        _template_shape(message, out)
    return record


def _template_shape(message: Message, out: dict[str, Any]) -> None:
    """Adjust one exported message for templates (in place)."""
    out.pop("weight", None)
    refusal = out.pop("refusal", None)
    if not out.get("content") and refusal is not None:
        out["content"] = refusal  # what the assistant said is the refusal
    out.setdefault("content", "")  # templates concatenate content: None would fail
    if message.role == "tool" and message.name is not None:
        out["name"] = message.name
    for call in out.get("tool_calls", []):
        # Most templates (Qwen, Llama 3.1, Hermes) `tojson` the arguments: give them the object.
        call["function"]["arguments"] = orjson.loads(call["function"]["arguments"])


def serving_template(tokenizer: PreTrainedTokenizerBase) -> str | None:
    """The chat template a model trained here should be served with, so that serving renders
    every conversation exactly as training did: the model's own, or, where training fell back to
    CHATML_TOOLS_TEMPLATE for conversations with tools (SmolLM2), both joined on the same test
    `Renderer` uses (tool definitions, a tool turn or a tool call present)."""
    own = tokenizer.chat_template
    if not isinstance(own, str) or _tools_template(tokenizer) != CHATML_TOOLS_TEMPLATE:
        return own if isinstance(own, str) else None
    return (
        "{% set ns = namespace(tools=(tools is defined and tools)) %}"
        "{% for m in messages %}{% if m.role == 'tool' or m.tool_calls %}"
        "{% set ns.tools = true %}{% endif %}{% endfor %}"
        f"{{% if ns.tools %}}{CHATML_TOOLS_TEMPLATE}{{% else %}}{own}{{% endif %}}"
    )


def _tools_template(tokenizer: PreTrainedTokenizerBase) -> str | None:
    """'native' when the model's template renders tool schemas and calls, our ChatML tools
    template when a ChatML template cannot (SmolLM2), else None (tool samples are refused)."""
    call: dict[str, Any] = {"type": "function", "function": {"name": _PROBE_CALL, "arguments": {}}}
    probe: list[dict[str, Any]] = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
    ]
    tools = [{"type": "function", "function": {"name": _PROBE_TOOL, "parameters": {}}}]
    text = _try_render(tokenizer, probe, tools)
    if _PROBE_TOOL in text and _PROBE_CALL in text:
        return "native"
    chatml = "<|im_start|>user\nhi<|im_end|>" in _try_render(tokenizer, probe[:1], None)
    return CHATML_TOOLS_TEMPLATE if chatml else None


def _try_render(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, Any]], tools: Any
) -> str:
    try:
        return str(tokenizer.apply_chat_template(messages, tools=tools, tokenize=False))
    except Exception:  # a template that cannot take this input: an answer, not a failure
        return ""


def _finish(
    sample_id: str, input_ids: list[int], labels: list[int], max_seq_len: int | None
) -> TokenizedExample:
    """Shift the labels and truncate from the end (the prompt start is what must stay)."""
    shifted = [*labels[1:], IGNORE_INDEX]
    truncated = max_seq_len is not None and len(input_ids) > max_seq_len
    if truncated:
        input_ids, shifted = input_ids[:max_seq_len], shifted[:max_seq_len]
        shifted[-1] = IGNORE_INDEX
        if all(label == IGNORE_INDEX for label in shifted):
            raise RenderError(
                sample_id,
                "too_long",
                f"no assistant token within max_seq_len={max_seq_len} "
                f"(the sample has {len(labels)} tokens)",
            )
    return TokenizedExample(input_ids, shifted, sample_id, truncated=truncated)
