"""turns keep what a worker taking them over needs to continue their reply

``turns.reply_token_ids`` (packed like ``messages.token_ids``) holds the token
ids of ``turns.reply_text`` while the turn runs, saved together with it;
``turns.delivery`` where its platform message is (a channel's own state, JSON);
``turns.resumes`` how many times another worker or a failed engine stream
continued it (bounded). A continuation of a reply cut at the length limit
names the turn it continues (``continues_turn_id``) and how many of its reply's
token ids it carried over (``continued_tokens``).

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-08
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("turns", schema=None) as batch_op:
        batch_op.add_column(sa.Column("reply_token_ids", sa.LargeBinary(), nullable=True))
        batch_op.add_column(sa.Column("delivery", sa.JSON(), nullable=True))
        batch_op.add_column(
            sa.Column("resumes", sa.Integer(), nullable=False, server_default=sa.text("0"))
        )
        batch_op.add_column(sa.Column("continues_turn_id", sa.String(32), nullable=True))
        batch_op.add_column(sa.Column("continued_tokens", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("turns", schema=None) as batch_op:
        batch_op.drop_column("continued_tokens")
        batch_op.drop_column("continues_turn_id")
        batch_op.drop_column("resumes")
        batch_op.drop_column("delivery")
        batch_op.drop_column("reply_token_ids")
