"""turns that came in through the OpenAI-compatible API, findable by their context

Revision ID: 0006
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "openai_exchanges",
        sa.Column("turn_id", sa.String(length=32), nullable=False),
        sa.Column("conversation_id", sa.String(length=32), nullable=False),
        sa.Column("owner", sa.String(length=200), nullable=False),
        sa.Column("context_hash", sa.String(length=64), nullable=False),
        sa.Column("api", sa.String(length=32), nullable=False),
        sa.Column("stored", sa.Boolean(), nullable=False),
        sa.Column("previous_response_id", sa.String(length=64), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        # No foreign key on turn_id: see OpenAIExchange.turn_id (claims skip locked turns).
        sa.ForeignKeyConstraint(
            ["conversation_id"],
            ["conversations.id"],
            name=op.f("fk_openai_exchanges_conversation_id_conversations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("turn_id", name=op.f("pk_openai_exchanges")),
    )
    with op.batch_alter_table("openai_exchanges", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_openai_exchanges_conversation_id"), ["conversation_id"], unique=False
        )
        batch_op.create_index(
            "ix_openai_exchanges_owner_context", ["owner", "context_hash"], unique=False
        )


def downgrade() -> None:
    op.drop_table("openai_exchanges")
