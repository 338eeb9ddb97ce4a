"""Storage: the Alembic schema matches the models on both backends; token ids round-trip."""

from __future__ import annotations

import asyncio

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy.engine import Connection

from bot.storage.db import create_engine
from bot.storage.migrate import downgrade, upgrade
from bot.storage.models import Base
from bot.storage.tokens import pack_token_ids, unpack_token_ids


def test_token_ids_round_trip_compactly() -> None:
    ids = [0, 1, 2047, 65535, 2**32 - 1]
    packed = pack_token_ids(ids)
    assert len(packed) == 4 * len(ids)
    assert unpack_token_ids(packed) == ids
    with pytest.raises(ValueError):
        unpack_token_ids(b"\x00\x01\x02")


def _diff(connection: Connection) -> list[object]:
    context = MigrationContext.configure(connection, opts={"compare_type": True})
    return list(compare_metadata(context, Base.metadata))


@pytest.mark.parametrize(
    "empty_db_url", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
async def test_migrations_build_exactly_the_models_schema(empty_db_url: str) -> None:
    await asyncio.to_thread(upgrade, empty_db_url)
    engine = create_engine(empty_db_url)
    try:
        async with engine.connect() as connection:
            assert await connection.run_sync(_diff) == []
    finally:
        await engine.dispose()
    # And the way back works too.
    await asyncio.to_thread(downgrade, empty_db_url, "base")
    await asyncio.to_thread(upgrade, empty_db_url)
