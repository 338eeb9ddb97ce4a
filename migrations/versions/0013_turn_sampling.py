"""turns keep the sampling parameters their client chose

``turns.sampling`` (JSON, NULL: the service's ``[generation]`` settings) is
what every run of a turn builds its engine request from: in another worker,
resumed, continued or regenerated (``bot.turns.sampling``).

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-08
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("turns", schema=None) as batch_op:
        batch_op.add_column(sa.Column("sampling", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("turns", schema=None) as batch_op:
        batch_op.drop_column("sampling")
