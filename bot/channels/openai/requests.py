"""Request bodies of the OpenAI-compatible endpoints, and what is done with each field.

Honoured: ``model`` (must be the served model), ``messages`` / ``input``,
``stream``, ``stream_options.include_usage``, ``user``, and on responses
``instructions``, ``previous_response_id`` and ``store``.

Accepted and ignored: sampling and length fields (``temperature``,
``top_p``, ``max_tokens``, ``max_completion_tokens``, ``max_output_tokens``,
``stop``, ``seed``, penalties, ``metadata``, ...). Every turn runs with the
service's ``generation`` settings, whichever channel it came from. Any other
field is ignored too, so clients that send vendor extras keep working.

Refused with 400, because the answer would not be what the client asked
for: ``n`` other than 1, tools and function calls, ``logprobs``, a
``response_format`` other than text, audio output, non-text content (images,
files).
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from bot.channels.openai.errors import bad_request
from bot.channels.openai.messages import Folded, MessagesError, fold

USER_MAX = 200


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    stream: bool = False
    user: str | None = Field(default=None, max_length=USER_MAX)
    tools: list[Any] | None = None
    response_format: dict[str, Any] | None = None

    def refuse_unsupported(self) -> None:
        if self.tools:
            raise bad_request("Tools are not supported by this service.", "tools")
        if self.response_format and self.response_format.get("type", "text") != "text":
            raise bad_request("Only text responses are supported.", "response_format")


class ChatCompletionRequest(_Common):
    messages: list[dict[str, Any]] = Field(min_length=1)
    stream_options: StreamOptions | None = None
    n: int = 1
    functions: list[Any] | None = None
    logprobs: bool | None = None
    modalities: list[str] | None = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.n != 1:
            raise bad_request("Only n=1 is supported.", "n")
        if self.functions:
            raise bad_request("Function calls are not supported by this service.", "functions")
        if self.logprobs:
            raise bad_request("logprobs are not supported by this service.", "logprobs")
        if self.modalities and set(self.modalities) - {"text"}:
            raise bad_request("Only text output is supported.", "modalities")

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class ResponsesRequest(_Common):
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool = True
    text: dict[str, Any] | None = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        text_format = (self.text or {}).get("format") or {}
        if text_format.get("type", "text") != "text":
            raise bad_request("Only text responses are supported.", "text.format")


Request = TypeVar("Request", bound=_Common)


def parse(model: type[Request], document: dict[str, Any]) -> Request:
    try:
        parsed = model.model_validate(document)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "body"
        raise bad_request(f"{where}: {first['msg']}", where) from None
    parsed.refuse_unsupported()
    return parsed


def fold_messages(messages: list[dict[str, Any]], where: str) -> Folded:
    """``messages.fold``; a list it cannot fold is a 400 naming ``where``."""
    try:
        return fold(messages, where)
    except MessagesError as exc:
        raise bad_request(str(exc), where) from None
