"""What the OpenAI-compatible endpoints answer with, typed: completions, chunks, responses.

The shapes are OpenAI's (the SDKs parse them into their own types); declaring
them here keeps every answer's fields in one place, as the requests' are in
``requests``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, model_serializer

FinishReason = Literal["stop", "length"]
FINISH_REASONS: frozenset[str] = frozenset({"stop", "length"})


def finish_reason(raw: str | None) -> FinishReason:
    """The engine's reason as OpenAI names it: ``length`` when a token cap cut the reply."""
    return "length" if raw == "length" else "stop"


# -- chat completions -------------------------------------------------------------------


class PromptTokensDetails(BaseModel):
    cached_tokens: int


class CompletionTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    completion_tokens_details: CompletionTokensDetails = Field(
        default_factory=CompletionTokensDetails
    )


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str
    refusal: None = None


class Choice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: None = None
    finish_reason: FinishReason


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    system_fingerprint: None = None
    choices: list[Choice]
    usage: Usage


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None

    @model_serializer
    def _given(self) -> dict[str, Any]:
        # OpenAI's deltas carry only what changed: the role once, then text.
        return {
            name: value
            for name, value in (("role", self.role), ("content", self.content))
            if value is not None
        }


class ChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    logprobs: None = None
    finish_reason: FinishReason | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    system_fingerprint: None = None
    choices: list[ChunkChoice]
    usage: Usage | None = None


# -- responses ---------------------------------------------------------------------------

ResponseStatus = Literal["queued", "in_progress", "completed", "incomplete", "failed"]


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


class MessageItem(BaseModel):
    id: str
    type: Literal["message"] = "message"
    status: Literal["in_progress", "completed"]
    role: Literal["assistant"] = "assistant"
    content: list[OutputText]


class InputTokensDetails(BaseModel):
    cached_tokens: int


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int


class ResponseError(BaseModel):
    code: str
    message: str


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"] = "max_output_tokens"


class TextFormat(BaseModel):
    type: Literal["text"] = "text"


class TextSettings(BaseModel):
    format: TextFormat = Field(default_factory=TextFormat)


class Response(BaseModel):
    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: ResponseStatus
    model: str
    output: list[MessageItem]
    usage: ResponseUsage | None = None
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    previous_response_id: str | None = None
    store: bool = True
    instructions: None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    parallel_tool_calls: bool = False
    tool_choice: Literal["none"] = "none"
    tools: list[Any] = Field(default_factory=list)
    temperature: float | None = None
    top_p: float | None = None
    max_output_tokens: int | None = None
    text: TextSettings = Field(default_factory=TextSettings)
    truncation: Literal["disabled"] = "disabled"
    user: str | None = None
