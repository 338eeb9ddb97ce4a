"""HMAC-SHA256 signatures over ``{timestamp}.{body}``, both directions.

Headers::

    X-Webhook-Timestamp: 1767225600            (Unix seconds)
    X-Webhook-Signature: v1=<hex HMAC-SHA256(secret, "1767225600." + raw body)>

The timestamp is signed so a captured request cannot be replayed after the
window; the comparison is constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
import time

TIMESTAMP_HEADER = "X-Webhook-Timestamp"
SIGNATURE_HEADER = "X-Webhook-Signature"
DELIVERY_HEADER = "X-Webhook-Delivery"
SIGNATURE_VERSION = "v1"
REPLAY_WINDOW_S = 300
# Unix seconds have 10 digits until the year 2286; more is never a real timestamp
# (and Python refuses int() of over 4,300 digits, which must not become a 500).
TIMESTAMP_MAX_DIGITS = 12


def signature(secret: str, timestamp: str, body: bytes) -> str:
    digest = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return f"{SIGNATURE_VERSION}={digest.hexdigest()}"


def signed_headers(secret: str, body: bytes, now: float | None = None) -> dict[str, str]:
    timestamp = str(int(time.time() if now is None else now))
    return {TIMESTAMP_HEADER: timestamp, SIGNATURE_HEADER: signature(secret, timestamp, body)}


def verify_any(
    secrets: list[str],
    timestamp: str | None,
    signature_header: str | None,
    body: bytes,
    *,
    now: float | None = None,
) -> str | None:
    """``verify`` against each secret (a rotation's current and previous ones): None if any fits.

    Every secret is tried, so the time taken does not tell which one matched.
    """
    reasons = [verify(secret, timestamp, signature_header, body, now=now) for secret in secrets]
    return None if None in reasons else reasons[0]


def verify(
    secret: str,
    timestamp: str | None,
    signature_header: str | None,
    body: bytes,
    *,
    now: float | None = None,
    window_s: int = REPLAY_WINDOW_S,
) -> str | None:
    """None when the request is authentic and fresh, else why not (for logs; never the secret)."""
    if not timestamp or not signature_header:
        return "missing signature headers"
    if not timestamp.isascii() or not timestamp.isdigit() or len(timestamp) > TIMESTAMP_MAX_DIGITS:
        return "timestamp is not Unix seconds"
    current = time.time() if now is None else now
    if abs(current - int(timestamp)) > window_s:
        return "timestamp outside the replay window"
    expected = signature(secret, timestamp, body)
    if not hmac.compare_digest(expected.encode(), signature_header.strip().encode()):
        return "signature mismatch"
    return None
