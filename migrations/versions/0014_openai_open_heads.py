"""OpenAI exchanges are found by the key of their conversation's open head

``openai_exchanges.head_key`` names the state a turn answers (the exchanges
before it, its own message, its end user) while it is its conversation's latest
turn; the index on (owner, head_key) replaces the one on (owner, context_hash),
which made a request look at the newest few turns of a key with the same
context (every first turn has the empty one). The rows of turns that are their
conversation's latest get their key here, so their conversations can still be
continued.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-08
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _head_key(scope: str | None, context_hash: str, user_text: str) -> str:
    # bot.turns.carried.head_key as of this revision, written out: a migration must not
    # change with the code.
    piece = json.dumps(
        [scope or "", context_hash, user_text.strip()], ensure_ascii=False, separators=(",", ":")
    )
    return hashlib.sha256(piece.encode()).hexdigest()


def upgrade() -> None:
    with op.batch_alter_table("openai_exchanges", schema=None) as batch_op:
        batch_op.add_column(sa.Column("head_key", sa.String(length=64), nullable=True))
        batch_op.drop_index("ix_openai_exchanges_owner_context")
        batch_op.create_index(
            "ix_openai_exchanges_owner_head_key", ["owner", "head_key"], unique=False
        )
    connection = op.get_bind()
    latest = connection.execute(
        sa.text(
            "SELECT e.turn_id, e.context_hash, t.user_id, t.user_text"
            " FROM openai_exchanges AS e"
            " JOIN turns AS t ON t.id = e.turn_id"
            " JOIN conversations AS c ON c.id = e.conversation_id"
            " WHERE c.next_turn_seq = t.seq + 1"
        )
    ).all()
    for turn_id, context_hash, user_id, user_text in latest:
        connection.execute(
            sa.text("UPDATE openai_exchanges SET head_key = :key WHERE turn_id = :turn_id"),
            {"key": _head_key(user_id, context_hash, user_text), "turn_id": turn_id},
        )


def downgrade() -> None:
    with op.batch_alter_table("openai_exchanges", schema=None) as batch_op:
        batch_op.drop_index("ix_openai_exchanges_owner_head_key")
        batch_op.create_index(
            "ix_openai_exchanges_owner_context", ["owner", "context_hash"], unique=False
        )
        batch_op.drop_column("head_key")
