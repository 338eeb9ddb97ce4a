"""Messages answered with an apology instead of a turn (too long, over a limit): once each.

Nothing is stored for a declined message, so a platform's redelivery of one has
nothing to be deduplicated by: the deliveries declined are remembered here
(bounded) and a redelivery is not answered again.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable

import structlog

from bot.errors import ErrorClass
from bot.turns.inbound import InboundMessage
from bot.turns.replies import ReplySink, TurnAddress

log = structlog.get_logger(__name__)

DECLINED_KEPT = 10_000


class Declines:
    """Apologies for the messages that get no turn, sent in the background."""

    def __init__(self, open_reply: Callable[[TurnAddress], ReplySink]) -> None:
        self._open_reply = open_reply
        self.pending: set[asyncio.Task[None]] = set()
        """The apologies still being sent (a shutdown waits for them)."""
        # Deliveries answered with an apology instead of a turn: a platform's redelivery
        # of one of them (nothing was stored to deduplicate it by) is not answered again.
        self._declined: OrderedDict[tuple[str, str], None] = OrderedDict()

    def decline(self, message: InboundMessage, error_class: ErrorClass, user_message: str) -> None:
        """Tell the sender why their message gets no reply (too long, over a limit); store nothing.

        Chat platforms hear it from the bot, in the background; the HTTP API's sink
        is silent (its client already has the 400 or 429). Once per delivery.
        """
        delivery = (message.channel, message.event_id)
        if delivery in self._declined:
            log.info("duplicate_delivery", channel=message.channel, event_id=message.event_id)
            return
        self._declined[delivery] = None
        while len(self._declined) > DECLINED_KEPT:
            self._declined.popitem(last=False)
        task = asyncio.create_task(self._apologise(message, error_class, user_message))
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    async def _apologise(
        self, message: InboundMessage, error_class: ErrorClass, user_message: str
    ) -> None:
        try:
            address = TurnAddress("", "", message.channel, dict(message.reply_to))
            await self._open_reply(address).fail(error_class, user_message)
        except Exception as exc:
            log.warning("apology_not_delivered", error=f"{type(exc).__name__}: {exc}")
