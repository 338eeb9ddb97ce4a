"""long conversations (compactions), coalesced turns, fair-use limits and counters

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # batch mode: SQLite cannot ALTER TABLE ADD COLUMN for everything; PostgreSQL runs plain ALTERs.
    with op.batch_alter_table("turns", schema=None) as batch_op:
        batch_op.add_column(sa.Column("api_key_id", sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column("coalesced_into", sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column("compaction_id", sa.String(length=32), nullable=True))

    op.create_table(
        "compactions",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("conversation_id", sa.String(length=32), nullable=False),
        sa.Column("turn_id", sa.String(length=32), nullable=False),
        sa.Column("base_seq", sa.Integer(), nullable=False),
        sa.Column("kept_from_seq", sa.Integer(), nullable=True),
        sa.Column("summary", sa.Text(), nullable=True),
        sa.Column("dropped_exchanges", sa.Integer(), nullable=False),
        sa.Column("kept_exchanges", sa.Integer(), nullable=False),
        sa.Column("tokens_before", sa.Integer(), nullable=False),
        sa.Column("tokens_after", sa.Integer(), nullable=False),
        sa.Column("reasoning_dropped", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["conversation_id"],
            ["conversations.id"],
            name=op.f("fk_compactions_conversation_id_conversations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_compactions")),
    )
    with op.batch_alter_table("compactions", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_compactions_conversation_id"), ["conversation_id"], unique=False
        )

    op.create_table(
        "limit_overrides",
        sa.Column("subject", sa.String(length=300), nullable=False),
        sa.Column("messages_per_minute", sa.Integer(), nullable=True),
        sa.Column("tokens_per_day", sa.BigInteger(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("subject", name=op.f("pk_limit_overrides")),
    )
    op.create_table(
        "usage_counters",
        sa.Column("subject", sa.String(length=300), nullable=False),
        sa.Column("metric", sa.String(length=32), nullable=False),
        sa.Column("window_start", sa.BigInteger(), nullable=False),
        sa.Column("value", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("subject", "metric", name=op.f("pk_usage_counters")),
    )


def downgrade() -> None:
    op.drop_table("usage_counters")
    op.drop_table("limit_overrides")
    with op.batch_alter_table("compactions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_compactions_conversation_id"))
    op.drop_table("compactions")
    with op.batch_alter_table("turns", schema=None) as batch_op:
        batch_op.drop_column("compaction_id")
        batch_op.drop_column("coalesced_into")
        batch_op.drop_column("api_key_id")
