"""The error taxonomy every failed turn is recorded with.

One flat set of classes, shared by every layer, so that a turn's log line,
its database row, the metrics and the user-facing error all say the same
thing. Where each class comes from::

    ErrorClass
    ├── auth               credentials refused (our API key, a platform token, a remote engine key)
    ├── bad_request        the inbound message itself is unusable
    ├── context_overflow   the prompt would not fit in the model's context window
    ├── model_not_found    the engine does not serve the configured model
    ├── engine_unavailable the engine is down, starting, or answered 5xx
    ├── oom                the engine ran out of memory (KV cache or host)
    ├── network            connection refused, DNS, proxy: the address is wrong or unreachable
    ├── upstream_protocol  a peer answered, but not in the format it promised
    ├── rate_limited       a limit (ours, a platform's, an engine's) said "later"
    ├── timeout            a peer did not answer in time
    ├── delivery           the reply could not be delivered to the platform
    ├── cancelled          the user or an operator stopped the turn
    └── internal           a bug on our side
"""

from __future__ import annotations

import enum


class ErrorClass(enum.StrEnum):
    AUTH = "auth"
    BAD_REQUEST = "bad_request"
    CONTEXT_OVERFLOW = "context_overflow"
    MODEL_NOT_FOUND = "model_not_found"
    ENGINE_UNAVAILABLE = "engine_unavailable"
    OOM = "oom"
    NETWORK = "network"
    UPSTREAM_PROTOCOL = "upstream_protocol"
    RATE_LIMITED = "rate_limited"
    TIMEOUT = "timeout"
    DELIVERY = "delivery"
    CANCELLED = "cancelled"
    INTERNAL = "internal"


_UNAVAILABLE = "Sorry, the assistant is unavailable right now. Please try again in a moment."
_MISCONFIGURED = "Sorry, the assistant is not configured correctly right now."

# What the end user is told, per class: short, no internals, no secrets.
USER_MESSAGES: dict[ErrorClass, str] = {
    ErrorClass.AUTH: _MISCONFIGURED,
    ErrorClass.BAD_REQUEST: "Sorry, I could not read that message.",
    ErrorClass.CONTEXT_OVERFLOW: (
        "Sorry, that is too long for me to answer. "
        "Try a shorter message or start a new conversation."
    ),
    ErrorClass.MODEL_NOT_FOUND: _MISCONFIGURED,
    ErrorClass.ENGINE_UNAVAILABLE: _UNAVAILABLE,
    ErrorClass.OOM: "Sorry, the assistant is overloaded right now. Please try again in a moment.",
    ErrorClass.NETWORK: _UNAVAILABLE,
    ErrorClass.UPSTREAM_PROTOCOL: "Sorry, something went wrong on our side. Please try again.",
    ErrorClass.RATE_LIMITED: "Sorry, too many messages right now. Please try again a little later.",
    ErrorClass.TIMEOUT: "Sorry, the assistant took too long to answer. Please try again.",
    ErrorClass.DELIVERY: "Sorry, I could not deliver the whole reply.",
    ErrorClass.CANCELLED: "Stopped.",
    ErrorClass.INTERNAL: "Sorry, something went wrong on our side. Please try again.",
}


class BotError(Exception):
    """An error that knows its class; ``hint`` is for operators (logs, doctor)."""

    def __init__(self, error_class: ErrorClass, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.error_class = error_class
        self.message = message
        self.hint = hint

    @property
    def user_message(self) -> str:
        return USER_MESSAGES[self.error_class]


class EngineError(BotError):
    """The inference engine failed or refused a request."""


class DeliveryError(BotError):
    """A channel could not deliver (part of) a reply to its platform."""


class ContextOverflow(BotError):
    """The prompt plus the tokens to generate would not fit in the context window."""

    def __init__(self, prompt_tokens: int, max_tokens: int, max_model_len: int) -> None:
        super().__init__(
            ErrorClass.CONTEXT_OVERFLOW,
            f"prompt of {prompt_tokens} tokens + {max_tokens} to generate "
            f"exceeds max_model_len {max_model_len}",
        )
        self.prompt_tokens = prompt_tokens


# Doctor-only error classes, beside ``ErrorClass``: faults an admin
# fixes in the configuration or with a command, which no turn ever fails with.
CONFIG = "config"
PENDING_MIGRATION = "pending_migration"


class DoctorFailure(Exception):
    """A check failed: what broke (error class), what was seen, what usually fixes it."""

    def __init__(self, error_class: str, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.error_class = error_class
        self.message = message
        self.hint = hint
