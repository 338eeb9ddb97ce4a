"""Continuing a reply from its saved token ids: after a dead worker, a failed engine stream,
or on request when it was cut at the length limit (docs/replies.md).

The engine gets the prompt plus the reply's token ids so far, id for id, so its
prefix cache serves them and only the rest is generated. The engine's text for
such a request starts after those ids, and they may end inside a multibyte
character (the bytes the first run held back), so the text of a continued
reply is not the engine's: ``ContinuedText`` decodes the reply's ids after the
prompt's last ids and hands out only what follows the text already given.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bot.errors import EngineError, ErrorClass
from bot.storage.models import Turn
from bot.storage.text import REPLACEMENT, storable
from bot.storage.tokens import unpack_token_ids
from bot.turns.chat_format import Tokenizer

RESUMABLE_ENGINE_ERRORS = frozenset(
    {ErrorClass.ENGINE_UNAVAILABLE, ErrorClass.TIMEOUT, ErrorClass.NETWORK}
)
"""An engine stream that broke with one of these is continued from its saved ids: a replica
killed or restarted, a dropped connection, a stalled stream. Others (a refused request, an
overflow, a model error) would fail again the same way."""
MAX_ENGINE_RESUMES = 3
"""Engine streams one run of a turn continues after; the next failure fails the turn."""
ENGINE_RESUME_BACKOFF_S = (0.2, 1.0, 3.0)
"""Pauses before each continuation of a broken engine stream (a router needs a moment to
notice a dead replica; an engine that is down stays down through all of them)."""
MAX_TAKEOVERS = 3
"""Times a turn is taken over after its worker died; once more and it is failed."""
TAKEOVER_WINDOW_S = 600.0
"""A turn older than this when its worker died is failed, not continued: its user has
stopped waiting, and its conversation's next messages wait behind it."""
_DECODE_CONTEXT = 8
"""Prompt ids decoded before the reply's: a tokenizer's text for the reply's first ids may
depend on what precedes them (a leading space)."""


def resumable(exc: BaseException, resumes: int) -> bool:
    """A broken engine stream that is continued (the ``resumes``-th time so far)."""
    return (
        isinstance(exc, EngineError)
        and exc.error_class in RESUMABLE_ENGINE_ERRORS
        and resumes < MAX_ENGINE_RESUMES
    )


def engine_backoff(resumes: int) -> float:
    return ENGINE_RESUME_BACKOFF_S[min(resumes, len(ENGINE_RESUME_BACKOFF_S) - 1)]


def carried_ids(turn: Turn) -> list[int]:
    """The reply's token ids its row holds as a run starts: a turn taken over from a dead
    worker, or a continuation of a cut reply. Empty for a turn starting afresh."""
    if turn.reply_token_ids is None or not (turn.reply_text or turn.continued_tokens):
        return []
    return unpack_token_ids(turn.reply_token_ids)


def ended_before(generated: Sequence[int], max_tokens: int, eos_token_id: int | None) -> str | None:
    """The finish reason of a reply complete before it was continued (its worker died after
    its last token, before its final write), or None when there is more to generate."""
    if max_tokens <= 0:
        return "length"
    if generated and eos_token_id is not None and generated[-1] == eos_token_id:
        return "stop"
    return None


@dataclass
class ContinuedText:
    """The text of a reply continued from ``carried`` ids, whose text ``given`` is out already.

    ``text(ids)`` is the whole reply's text for the reply's ids so far (``carried`` and what
    the engine added): ``given`` and then the decoded rest, never ``given`` again, and
    never the prompt. A character not complete yet (its bytes held back) is left out
    until it is.
    """

    tokenizer: Tokenizer
    context: list[int]
    given: str
    _skip: str = ""
    _last: str = ""

    @classmethod
    def after(
        cls, tokenizer: Tokenizer, prompt: Sequence[int], carried: Sequence[int], given: str
    ) -> ContinuedText:
        continued = cls(tokenizer, list(prompt[-_DECODE_CONTEXT:]), given)
        continued._skip = continued._decoded(carried)
        return continued

    def _decoded(self, reply_ids: Sequence[int], *, final: bool = False) -> str:
        whole = self.tokenizer.decode([*self.context, *reply_ids], skip_special_tokens=True)
        prompt = self.tokenizer.decode(self.context, skip_special_tokens=True)
        text = whole[len(prompt) :] if whole.startswith(prompt) else whole
        # Bytes held back at the end decode to U+FFFD: not a character yet (until the end).
        return storable(text if final else text.rstrip(REPLACEMENT))

    def text(self, reply_ids: Sequence[int], *, final: bool = False) -> str:
        decoded = self._decoded(reply_ids, final=final)
        if not decoded.startswith(self._skip):
            # The tokenizer changed its mind about the carried ids' text (it never should):
            # nothing new can be told apart from them yet.
            return self._last or self.given
        text = self.given + decoded[len(self._skip) :]
        if self._last and not text.startswith(self._last):
            # A decoder that tidies earlier text (spaces before punctuation) must not take
            # back what was given: what is out stays, the rest follows it.
            text = self._last + text[len(self._last) :]
        self._last = text
        return text
