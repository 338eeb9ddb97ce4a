"""The signature scheme on its own: what verifies and what does not."""

from __future__ import annotations

import time

from bot.channels.webhook.signing import signature, signed_headers, verify

SECRET = "s3cret-s3cret-s3cret"
BODY = b'{"text":"hi"}'


def test_own_signature_verifies() -> None:
    headers = signed_headers(SECRET, BODY)
    assert (
        verify(SECRET, headers["X-Webhook-Timestamp"], headers["X-Webhook-Signature"], BODY) is None
    )


def test_signature_is_hmac_sha256_over_timestamp_dot_body() -> None:
    # Known answer from openssl, as docs/webhook.md tells senders to compute it:
    # printf '1700000000.{"text":"hi"}' | openssl dgst -sha256 -hmac s3cret-s3cret-s3cret -hex
    expected = "e35fc15c57a6699b7a90a62de4e91a7a395ad6d3b239d6df694ddc234aa92c7f"
    assert signature(SECRET, "1700000000", BODY) == f"v1={expected}"


def test_refusals_name_the_reason_and_never_the_secret() -> None:
    now = int(time.time())
    ts = str(now)
    good = signature(SECRET, ts, BODY)
    stale, future = str(now - 301), str(now + 301)
    cases = {
        "missing": verify(SECRET, None, good, BODY),
        "tampered body": verify(SECRET, ts, good, BODY + b" "),
        "other secret": verify("another-secret-entirely", ts, good, BODY),
        "not a number": verify(SECRET, "soon", good, BODY),
        "stale": verify(SECRET, stale, signature(SECRET, stale, BODY), BODY),
        "future": verify(SECRET, future, signature(SECRET, future, BODY), BODY),
        "no prefix": verify(SECRET, ts, good.removeprefix("v1="), BODY),
    }
    assert all(reason is not None for reason in cases.values()), cases
    assert not any(SECRET in reason for reason in cases.values() if reason)
    # Inside the window on both sides is fine.
    edge = str(now - 299)
    assert verify(SECRET, edge, signature(SECRET, edge, BODY), BODY) is None
