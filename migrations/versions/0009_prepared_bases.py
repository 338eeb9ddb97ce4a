"""prepared_bases: a long conversation's next base, prepared before its compaction

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "prepared_bases",
        sa.Column("conversation_id", sa.String(length=32), nullable=False),
        sa.Column("claim", sa.String(length=32), nullable=False),
        sa.Column("ready", sa.Boolean(), nullable=False),
        sa.Column("lease_until", sa.DateTime(timezone=True), nullable=False),
        sa.Column("after_base_seq", sa.Integer(), nullable=False),
        sa.Column("head_seq", sa.Integer(), nullable=True),
        sa.Column("covered_tokens", sa.Integer(), nullable=False),
        sa.Column("covered_digest", sa.String(length=64), nullable=False),
        sa.Column("token_ids", sa.LargeBinary(), nullable=True),
        sa.Column("kept_from_seq", sa.Integer(), nullable=True),
        sa.Column("summary", sa.Text(), nullable=True),
        sa.Column("dropped_exchanges", sa.Integer(), nullable=False),
        sa.Column("kept_exchanges", sa.Integer(), nullable=False),
        sa.Column("reasoning_dropped", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["conversation_id"],
            ["conversations.id"],
            name=op.f("fk_prepared_bases_conversation_id_conversations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("conversation_id", name=op.f("pk_prepared_bases")),
    )


def downgrade() -> None:
    op.drop_table("prepared_bases")
