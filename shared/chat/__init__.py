"""The canonical chat sample: the one shape every service passes around.

Ingest normalises OpenAI, Anthropic, Gemini, uploaded JSONL and OTel GenAI spans into `Sample`;
the dataset builder cleans, dedups and exports it; the trainer renders it with a chat template;
the evaluator replays its prompt. Design decisions:

* **One exchange, one choice per sample.** A response with n>1 choices becomes n samples that
  share the prompt and `source_ref` and differ in `response.choice_index` (part of the derived
  id). Each is a training example of its own; identical choices collapse in exact dedup, and
  siblings are found by `source_ref` (e.g. for preference pairs). `usage` is the whole call's.
* **Messages are OpenAI-shaped, content is always a list of parts.** Roles are system, user,
  assistant, tool (ingest maps Gemini `model` -> assistant, OpenAI `developer` -> system).
  A plain string given as content becomes one text part. A system prompt of several blocks
  (Anthropic `system: [...]`) is one system message with several text parts.
* **Parts are a union discriminated on `type`**: text, image, audio, file. Media bytes live in
  exactly one of `ref` (s3:// URI in our store, once ingest moved the bytes out), `url` (remote)
  or `data` (standard base64 + mime_type); `sha256` is of the raw bytes, so an image keeps its
  fingerprint when it moves from `data` to `ref`. A data: URI given as `url` is split on input.
* **Tool calls** live on the assistant message (`tool_calls`), after its text, as in OpenAI.
  `arguments` is a JSON string exactly as OpenAI sends it; Anthropic `input` / Gemini `args`
  objects are encoded on input (`ToolCall(arguments={...})`) and `parse_arguments()` decodes.
  `id` may be None (Gemini has none); results pair with calls by order, preferring the same
  name, and the OpenAI export gives such calls `call_<message>_<call>` ids.
* **Tool results** are `role="tool"` messages (Anthropic `tool_result` blocks inside a user
  turn become one tool message each) with `tool_call_id` and/or `name`, text or media content
  (a Gemini `functionResponse.response` object is stored as its JSON text) and `is_error`.
* **Reasoning is kept apart from the visible answer**: `Message.reasoning` holds blocks of text
  with an optional opaque `signature` (Anthropic thinking, Gemini thoughtSignature) or
  `redacted` data. `Message.text()` never includes it; a refusal is `Message.refusal`.
* **Response metadata** (`ResponseMeta`) keeps provider, requested and answering model,
  finish_reason normalised to stop/length/tool_calls/content_filter/error/other next to the raw
  value, usage with OpenAI semantics, latency, time to first token, and ok/error status with the
  provider's error summary. A failed call is a sample whose messages are the prompt only.
* **Identity**: `id` is derived when not given: uuid5 over tenant, source, source_ref and choice
  index (or the content fingerprint when there is no source_ref), so ingesting the same exchange
  twice gives the same id. `content_fingerprint()` hashes normalised messages and tools only.
"""

from shared.chat.export import ExportError, RefResolver, to_openai_messages
from shared.chat.finish import FinishReason, normalize_finish_reason
from shared.chat.identity import canonical_json, derive_sample_id
from shared.chat.parts import (
    AudioPart,
    ChatModel,
    ContentPart,
    FilePart,
    ImagePart,
    MediaPart,
    TextPart,
    parse_data_uri,
)
from shared.chat.schema import (
    SCHEMA_VERSION,
    Message,
    MetadataValue,
    Provider,
    ProviderError,
    ReasoningBlock,
    RequestParams,
    ResponseMeta,
    Role,
    Sample,
    Source,
    ToolCall,
    ToolDef,
    Usage,
    describe_errors,
    error_path,
)

__all__ = [
    "SCHEMA_VERSION",
    "AudioPart",
    "ChatModel",
    "ContentPart",
    "ExportError",
    "FilePart",
    "FinishReason",
    "ImagePart",
    "MediaPart",
    "Message",
    "MetadataValue",
    "Provider",
    "ProviderError",
    "ReasoningBlock",
    "RefResolver",
    "RequestParams",
    "ResponseMeta",
    "Role",
    "Sample",
    "Source",
    "TextPart",
    "ToolCall",
    "ToolDef",
    "Usage",
    "canonical_json",
    "derive_sample_id",
    "describe_errors",
    "error_path",
    "normalize_finish_reason",
    "parse_data_uri",
    "to_openai_messages",
]
