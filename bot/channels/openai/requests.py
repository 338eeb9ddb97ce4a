"""Request bodies of the OpenAI-compatible endpoints, typed (as vLLM's ``protocol.py`` does).

Every field this service reads is declared with its type and range; a value of
another type (a list as ``role``, a string as ``text.format``) is a 400 naming
the field, never an exception later. Client text is made storable here
(``bot.storage.text``: U+0000 and lone surrogates become U+FFFD) and ids that
are looked up are refused if they hold such characters.

Honoured: ``model`` (must be the served model), ``messages`` / ``input`` /
``instructions``, ``stream``, ``stream_options.include_usage``, ``user`` (part
of the conversation match, and the turn's user id), ``previous_response_id``,
``store``, and the sampling parameters (``Sampling``): ``max_tokens`` /
``max_completion_tokens`` / ``max_output_tokens`` (capped by the server's
``generation.max_tokens``), ``stop`` (at most four strings), ``temperature``,
``top_p``, ``seed``, ``presence_penalty``, ``frequency_penalty``.

Refused with 400, because the answer would not be what the client asked for:
``n`` other than 1, ``logprobs`` / ``top_logprobs``, tools and function calls,
a ``response_format`` or ``text.format`` other than text, audio output,
non-text content (images, files). Any other field is ignored, so clients that
send vendor extras keep working.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from bot.channels.openai.errors import bad_request
from bot.http.storable import StorableId, StorableText
from bot.turns.sampling import MAX_STOP_STRINGS, Sampling

USER_MAX = 200
"""The longest ``user`` (OpenAI's end-user id): it is stored as the turn's user id."""
STOP_MAX_CHARS = 200
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
"""``seed``'s range, as vLLM's own server takes it (a torch generator's seed)."""
TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text"})


Text = StorableText
"""Client text: stored and tokenized, so made storable on the way in."""


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ContentPart(_Body):
    """One part of a message's content; only text parts are answered (``fold``)."""

    type: str
    text: Text | None = None


Content = Text | list[ContentPart]


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: Content | None = None
    tool_calls: list[Any] | None = None
    function_call: dict[str, Any] | None = None


class InputMessage(_Body):
    """A Responses API input item; only messages are answered."""

    type: Literal["message"] = "message"
    role: Literal["system", "developer", "user", "assistant"]
    content: Content


class StreamOptions(_Body):
    include_usage: bool = False


class ResponseFormat(_Body):
    type: str = "text"


class TextConfig(_Body):
    format: ResponseFormat | None = None


class _Common(_Body):
    model: str
    stream: bool = False
    user: Annotated[Text, Field(max_length=USER_MAX)] | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    tools: list[Any] | None = None

    def refuse_unsupported(self) -> None:
        if self.tools:
            raise bad_request("Tools are not supported by this service.", "tools")

    def sampling(self) -> Sampling:
        return Sampling(temperature=self.temperature, top_p=self.top_p)


Penalty = Annotated[float, Field(ge=-2, le=2)]
StopString = Annotated[Text, Field(min_length=1, max_length=STOP_MAX_CHARS)]


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    stop: StopString | list[StopString] | None = None
    seed: int | None = Field(default=None, ge=INT64_MIN, le=INT64_MAX)
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    n: int | None = 1
    logprobs: bool | None = None
    top_logprobs: int | None = None
    functions: list[Any] | None = None
    response_format: ResponseFormat | None = None
    modalities: list[str] | None = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.n not in (None, 1):
            raise bad_request("Only n=1 is supported.", "n")
        if self.logprobs or self.top_logprobs:
            raise bad_request("logprobs are not supported by this service.", "logprobs")
        if self.functions:
            raise bad_request("Function calls are not supported by this service.", "functions")
        if self.response_format is not None and self.response_format.type != "text":
            raise bad_request("Only text responses are supported.", "response_format")
        if self.modalities and set(self.modalities) - {"text"}:
            raise bad_request("Only text output is supported.", "modalities")
        if len(self.stop_strings) > MAX_STOP_STRINGS:
            raise bad_request(f"stop takes at most {MAX_STOP_STRINGS} strings.", "stop")

    @property
    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def sampling(self) -> Sampling:
        return Sampling(
            # max_tokens is the older name of max_completion_tokens.
            max_tokens=self.max_completion_tokens or self.max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self.seed,
            stop=self.stop_strings,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
        )


class ResponsesRequest(_Common):
    input: Text | list[InputMessage]
    instructions: Text | None = None
    previous_response_id: StorableId | None = None
    store: bool = True
    text: TextConfig | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        text_format = self.text.format if self.text is not None else None
        if text_format is not None and text_format.type != "text":
            raise bad_request("Only text responses are supported.", "text.format")

    def sampling(self) -> Sampling:
        return Sampling(
            max_tokens=self.max_output_tokens, temperature=self.temperature, top_p=self.top_p
        )


Request = TypeVar("Request", bound=_Common)


def parse(model: type[Request], document: dict[str, Any]) -> Request:
    """``document`` as ``model``, or a 400 naming the first field that is wrong."""
    try:
        parsed = model.model_validate(document)
    except ValidationError as exc:
        first = exc.errors(include_input=False, include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"]) or "body"
        raise bad_request(f"{where}: {first['msg']}", where) from None
    parsed.refuse_unsupported()
    return parsed
