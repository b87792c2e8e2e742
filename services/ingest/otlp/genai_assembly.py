"""One trace's model calls and tool runs -> multi-turn samples.

The rule, in order:

1. Model calls are taken by end time (then start time): an agent span that encloses its model
   calls ends after them. Agent-level spans (`invoke_agent`, pydantic-ai's run span) are used
   only when the trace has no model-call span with messages, since model calls say exactly what
   each request sent.
2. Each call's transcript is what it sent plus its first choice. Calls are chained into
   conversations ("threads"): a call whose transcript starts with a thread's messages (the usual
   case: every call resends the history) replaces that thread's messages with its longer
   transcript; the latest, longest history wins. An equal transcript (the same call seen by two
   instrumentations) keeps the first. A call that sends only the new turn (tool results
   answering the thread's last tool calls) is appended to that thread. Anything else starts a
   new thread: unrelated calls in one trace (a guardrail check, a sub-agent) are separate
   conversations, so a trace gives one sample per conversation, normally one.
3. Tool results from `execute_tool` spans fill in only where a thread has a tool call with no
   result message: matched by `gen_ai.tool.call.id`, else by tool name in time order. Results of
   the thread's final tool-call turn are not appended, so the sample still ends with the model's
   answer. A tool run that no call matches is noted, never invented into an assistant turn.
4. A conversation is named by its trace and its opening (the messages up to the first user
   turn, which every call resends): source_ref is `<trace id>/<hash of the opening>`, so a
   conversation exported in several requests keeps one sample id and the store keeps its
   longest version. The last call supplies created_at (its start), params, response metadata
   and latency. n>1 choices give one sample per choice.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from services.ingest.normalize import Dropped
from services.ingest.otlp.export import Span
from services.ingest.otlp.genai_calls import ChatCall, ToolRun, read_span, result_message
from services.ingest.otlp.genai_messages import ConversionCache
from services.ingest.otlp.genai_parts import ContentError, Msg, Notes
from services.ingest.otlp.genai_sample import build_samples
from shared.chat import Sample, describe_errors

_AFTER_LAST = "after the final model turn; not appended, so the sample ends with the model's calls"
_NO_RESULT = "execute_tool span without gen_ai.tool.call.result"
_AGENT_UNUSED = "agent-level messages not used: the trace's model-call spans carry them"


@dataclass(frozen=True, slots=True)
class RejectedSpan:
    """A GenAI span whose content could not be read; `reason` names the attribute."""

    trace_id: str
    span_id: str
    reason: str


@dataclass(slots=True)
class TraceResult:
    """What a batch of spans gave: samples, rejected spans (for OTLP partial success) and notes
    on content left out (for the fidelity report)."""

    samples: list[Sample] = field(default_factory=list)
    rejected: list[RejectedSpan] = field(default_factory=list)
    # Content a sample does not carry, and why; paths read `span[<span id>].<attribute>`.
    dropped: list[Dropped] = field(default_factory=list)


@dataclass(slots=True)
class _Thread:
    """One conversation of a trace: its messages so far and the call that last extended it."""

    messages: list[Msg]
    keys: list[tuple[Any, ...]]
    last: ChatCall
    calls: list[ChatCall] = field(default_factory=list)
    tool_runs: int = 0


def assemble_trace(spans: list[Span], tenant: str, result: TraceResult) -> None:
    """One trace's spans -> its samples, rejections and notes, added to `result`."""
    calls, runs = _read_spans(spans, result)
    if not calls:
        _note_unused(runs, result)
        return
    threads: list[_Thread] = []
    keys = _KeyMemo()
    for call in sorted(calls, key=lambda c: (c.span.end_ns, c.span.start_ns, c.span.span_id)):
        _add_call(threads, call, keys)
    runs.sort(key=lambda r: (r.span.start_ns, r.span.span_id))
    for thread in threads:
        _fill_tool_results(thread, runs, result)
    _note_unused(runs, result)
    for thread in threads:
        _emit(thread, tenant, result)


def _read_spans(spans: list[Span], result: TraceResult) -> tuple[list[ChatCall], list[ToolRun]]:
    calls: list[ChatCall] = []
    runs: list[ToolRun] = []
    cache = ConversionCache()
    for span in spans:
        notes: Notes = []
        try:
            item = read_span(span, notes, cache)
        except ContentError as exc:
            result.rejected.append(RejectedSpan(span.trace_id, span.span_id, str(exc)))
            continue
        if notes:
            result.dropped.extend(_dropped(span, notes))
        if isinstance(item, ChatCall):
            calls.append(item)
        elif isinstance(item, ToolRun):
            runs.append(item)
    if any(not c.agent_level for c in calls):
        for call in calls:
            if call.agent_level:
                result.dropped.extend(_dropped(call.span, [("", _AGENT_UNUSED)]))
        calls = [c for c in calls if not c.agent_level]
    return calls, runs


def _dropped(span: Span, notes: Notes) -> Iterable[Dropped]:
    for path, reason in notes:
        yield Dropped(f"span[{span.span_id}].{path}" if path else f"span[{span.span_id}]", reason)


# --- threads ----------------------------------------------------------------------------------


class _KeyMemo:
    """message_key per message dict: the conversion cache shares dicts between the calls of a
    trace, so each history message is keyed once. Holding the dict keeps its id unique."""

    def __init__(self) -> None:
        self._keys: dict[int, tuple[Msg, tuple[Any, ...]]] = {}

    def __call__(self, messages: Iterable[Msg]) -> list[tuple[Any, ...]]:
        keys = []
        for message in messages:
            hit = self._keys.get(id(message))
            if hit is None or hit[0] is not message:
                hit = (message, message_key(message))
                self._keys[id(message)] = hit
            keys.append(hit[1])
        return keys


def message_key(message: Msg) -> tuple[Any, ...]:
    """What makes two messages the same turn across spans: role, content and tool calls; ids
    and whitespace at the ends do not count."""
    # List comprehensions, not generators: this runs for each distinct message of a trace.
    parts = tuple(
        [
            part["text"].strip()
            if part["type"] == "text"
            else (part.get("url"), part.get("data"), part.get("file_id"))
            for part in message["content"]
        ]
    )
    tool_calls = message.get("tool_calls")
    calls = tuple([(c["name"], c["arguments"]) for c in tool_calls]) if tool_calls else ()
    return (message["role"], parts, calls)


def _transcript(call: ChatCall) -> list[Msg]:
    return [*call.input, call.outputs[0][0]] if call.outputs else list(call.input)


def _add_call(threads: list[_Thread], call: ChatCall, memo: _KeyMemo) -> None:
    messages = _transcript(call)
    keys = memo(messages)
    extended = [t for t in threads if keys[: len(t.keys)] == t.keys]
    if extended:
        thread = max(extended, key=lambda t: len(t.keys))
        thread.calls.append(call)
        if len(keys) > len(thread.keys):
            thread.messages, thread.keys, thread.last = messages, keys, call
        return
    for thread in threads:
        if thread.keys[: len(keys)] == keys:
            thread.calls.append(call)  # already in the conversation (an outer span's view)
            return
    for thread in threads:
        if _continues(thread, call):
            tail = [*(m for m in call.input if m["role"] != "system"), *messages[len(call.input) :]]
            thread.messages = [*thread.messages, *tail]
            thread.keys = [*thread.keys, *memo(tail)]
            thread.last = call
            thread.calls.append(call)
            return
    threads.append(_Thread(messages, keys, call, [call]))


def _continues(thread: _Thread, call: ChatCall) -> bool:
    """True when the call sends only the next turn: tool results for the thread's last calls."""
    last = thread.messages[-1]
    if last["role"] != "assistant" or not last.get("tool_calls"):
        return False
    sent = [m for m in call.input if m["role"] != "system"]
    if not sent or sent[0]["role"] != "tool":
        return False
    ids = {c.get("id") for c in last["tool_calls"]} - {None}
    names = {c["name"] for c in last["tool_calls"]}
    first = sent[0]
    return first.get("tool_call_id") in ids or first.get("name") in names


# --- tool results -------------------------------------------------------------------------------


def _fill_tool_results(thread: _Thread, runs: list[ToolRun], result: TraceResult) -> None:
    """Insert tool results from execute_tool spans after each tool-call turn that lacks them."""
    messages = thread.messages
    filled: list[Msg] = []
    i = 0
    while i < len(messages):
        message = messages[i]
        filled.append(message)
        i += 1
        calls = message.get("tool_calls") if message["role"] == "assistant" else None
        if not calls:
            continue
        end = i
        while end < len(messages) and messages[end]["role"] == "tool":
            end += 1
        answered = messages[i:end]
        filled.extend(answered)
        final = end == len(messages)
        filled.extend(_results_for(calls, answered, runs, thread, result, final=final))
        i = end
    thread.messages = filled


def _results_for(
    calls: list[dict[str, Any]],
    answered: list[Msg],
    runs: list[ToolRun],
    thread: _Thread,
    result: TraceResult,
    *,
    final: bool,
) -> list[Msg]:
    """Tool messages for the calls of one turn that have no result yet. Runs whose result the
    history already holds are only marked used, so they are not reported as unmatched."""
    missing = _unanswered(calls, answered)
    added: list[Msg] = []
    for call in calls:
        run = _match_run(call, runs)
        if run is None:
            continue
        run.used = True
        thread.tool_runs += 1
        if not any(call is m for m in missing):
            continue
        if final:
            result.dropped.extend(_dropped(run.span, [("gen_ai.tool.call.result", _AFTER_LAST)]))
        elif run.result is None:
            result.dropped.extend(_dropped(run.span, [("", _NO_RESULT)]))
        else:
            added.append(result_message(call, run))
    return added


def _unanswered(calls: list[dict[str, Any]], answered: list[Msg]) -> list[dict[str, Any]]:
    ids = {m.get("tool_call_id") for m in answered} - {None}
    names = [m.get("name") for m in answered if m.get("tool_call_id") is None]
    missing = []
    for call in calls:
        if call.get("id") is not None and call["id"] in ids:
            continue
        if call["name"] in names:
            names.remove(call["name"])
            continue
        missing.append(call)
    return missing


def _match_run(call: dict[str, Any], runs: list[ToolRun]) -> ToolRun | None:
    free = [r for r in runs if not r.used]
    if call.get("id") is not None:
        for run in free:
            if run.call_id == call["id"]:
                return run
    return next((r for r in free if r.call_id is None and r.name == call["name"]), None)


def _note_unused(runs: list[ToolRun], result: TraceResult) -> None:
    for run in runs:
        if not run.used:
            reason = f"execute_tool span ({run.name}): no tool call of a model call matches it"
            result.dropped.extend(_dropped(run.span, [("", reason)]))


# --- samples ------------------------------------------------------------------------------------


def _emit(thread: _Thread, tenant: str, result: TraceResult) -> None:
    """The thread's samples; a thread that cannot make a valid sample rejects its last span."""
    span = thread.last.span
    notes: Notes = []
    try:
        samples = build_samples(
            thread.last, thread.messages, thread.calls, thread.tool_runs, tenant, notes
        )
    except ContentError as exc:
        result.rejected.append(RejectedSpan(span.trace_id, span.span_id, str(exc)))
        return
    except ValidationError as exc:
        reason = "sample: " + "; ".join(describe_errors(exc)[:5])
        result.rejected.append(RejectedSpan(span.trace_id, span.span_id, reason))
        return
    result.samples.extend(samples)
    result.dropped.extend(_dropped(span, notes))
