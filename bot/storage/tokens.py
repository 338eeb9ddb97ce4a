"""Compact storage of token ids: little-endian uint32, 4 bytes a token.

A thousand-turn chat of 300 tokens a turn is about 1.2 MB, stored once and
never re-tokenized.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable

_ITEMSIZE = 4


def pack_token_ids(token_ids: Iterable[int]) -> bytes:
    packed = array("I", token_ids)
    if packed.itemsize != _ITEMSIZE:  # pragma: no cover - every platform we run on has 4
        packed = array("L", token_ids)
    if sys.byteorder != "little":  # pragma: no cover
        packed.byteswap()
    return packed.tobytes()


def unpack_token_ids(data: bytes) -> list[int]:
    if len(data) % _ITEMSIZE:
        raise ValueError(f"packed token ids have {len(data)} bytes, not a multiple of {_ITEMSIZE}")
    unpacked = array("I")
    unpacked.frombytes(data)
    if sys.byteorder != "little":  # pragma: no cover
        unpacked.byteswap()
    return unpacked.tolist()
