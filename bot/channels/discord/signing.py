"""Is this interaction from Discord? Ed25519 over ``X-Signature-Timestamp`` + raw body.

Discord signs every request to the Interactions Endpoint URL with the
application's private key; the public key (``public_key``, hex) verifies it
(``cryptography``'s Ed25519, the same check Discord's docs show with PyNaCl).
Discord probes the endpoint with bad signatures when the URL is saved and
expects 401 for them. The signed timestamp is also held to a window around
our clock, so a captured request cannot be replayed later; a replay inside
the window is a repeated interaction id, which the turn store deduplicates.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

SIGNATURE_HEADER = "X-Signature-Ed25519"
TIMESTAMP_HEADER = "X-Signature-Timestamp"
SIGNATURE_BYTES = 64
TIMESTAMP_MAX_CHARS = 20


class InteractionVerifier:
    def __init__(
        self, public_key_hex: str, *, window_s: float, clock: Callable[[], float] = time.time
    ) -> None:
        self._key = Ed25519PublicKey.from_public_bytes(bytes.fromhex(public_key_hex))
        self._window_s = window_s
        self._clock = clock

    def verify(self, body: bytes, timestamp: str | None, signature: str | None) -> str | None:
        """None when Discord signed ``body`` at ``timestamp`` recently; else why not (for
        the log line: it names no header value)."""
        if not timestamp or not signature:
            return "missing signature headers"
        if len(timestamp) > TIMESTAMP_MAX_CHARS or not timestamp.isdigit():
            return "timestamp is not a number of seconds"
        if abs(self._clock() - int(timestamp)) > self._window_s:
            return "timestamp outside the replay window"
        try:
            raw_signature = bytes.fromhex(signature)
        except ValueError:
            return "signature is not hex"
        if len(raw_signature) != SIGNATURE_BYTES:
            return "signature has the wrong length"
        try:
            # Ed25519 verification compares in constant time inside the library.
            self._key.verify(raw_signature, timestamp.encode() + body)
        except InvalidSignature:
            return "signature does not match"
        return None
