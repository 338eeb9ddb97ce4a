"""What the turn runner applies beyond the core pipeline, in one bundle.

Each part is optional so the runner works without any of them: compaction of
long conversations, per-tenant cache salts, fair-use accounting and coalescing
of pending messages.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.engine.base import InferenceEngine
from bot.turns.chat_format import ChatFormat
from bot.turns.compaction import Compactor
from bot.turns.limits import FairUse
from bot.turns.partials import PartialReplies
from bot.turns.settings import (
    CompactionSettings,
    GenerationSettings,
    PendingMessages,
    TenancySettings,
)
from bot.turns.tenancy import CacheSalts


@dataclass(frozen=True)
class TurnPolicy:
    compactor: Compactor | None = None
    salts: CacheSalts | None = None
    fair_use: FairUse | None = None
    coalesce: bool = False
    partials: PartialReplies | None = None
    """Several workers: the reply so far is saved for readers on other workers."""

    def cache_salt(self, owner: str | None) -> str | None:
        """The salt of a conversation's tenant (its owner), if tenants are isolated.

        The owner comes with the history (``load_history``): no query of its own.
        """
        if self.salts is None or owner is None:
            return None
        return self.salts.salt_for(owner)


def build_policy(
    *,
    compaction: CompactionSettings,
    generation: GenerationSettings,
    tenancy: TenancySettings,
    pending_messages: PendingMessages,
    chat_format: ChatFormat,
    engine: InferenceEngine,
    sessions: async_sessionmaker[AsyncSession],
    fair_use: FairUse | None,
    read_sessions: async_sessionmaker[AsyncSession] | None = None,
    partials: PartialReplies | None = None,
) -> TurnPolicy:
    """The policy the configuration asks for (one per app)."""
    compactor = None
    if compaction.enabled:
        compactor = Compactor(
            settings=compaction,
            chat_format=chat_format,
            engine=engine,
            generation=generation,
            sessions=sessions,
            read_sessions=read_sessions,
        )
    return TurnPolicy(
        compactor=compactor,
        salts=CacheSalts(tenancy) if tenancy.isolate_cache else None,
        fair_use=fair_use,
        coalesce=pending_messages == "coalesce",
        partials=partials,
    )
