"""The signature scheme on its own: what verifies and what does not."""

from __future__ import annotations

import time

from bot.channels.webhook.signing import signature, signed_headers, verify

SECRET = "s3cret-s3cret-s3cret"
BODY = b'{"text":"hi"}'


def test_own_signature_verifies() -> None:
    headers = signed_headers(SECRET, BODY)
    assert verify(SECRET, headers["X-Webhook-Timestamp"], headers["X-Webhook-Signature"], BODY) is None


def test_signature_is_hmac_sha256_over_timestamp_dot_body() -> None:
    # Known answer, computed independently: printf '1700000000.{"text":"hi"}' | openssl dgst -sha256 -hmac ...
    import hashlib
    import hmac

    expected = hmac.new(SECRET.encode(), b'1700000000.{"text":"hi"}', hashlib.sha256).hexdigest()
    assert signature(SECRET, "1700000000", BODY) == f"v1={expected}"


def test_refusals_name_the_reason_and_never_the_secret() -> None:
    now = time.time()
    ts = str(int(now))
    good = signature(SECRET, ts, BODY)
    cases = {
        "missing": verify(SECRET, None, good, BODY),
        "tampered body": verify(SECRET, ts, good, BODY + b" "),
        "other secret": verify("another-secret-entirely", ts, good, BODY),
        "not a number": verify(SECRET, "soon", good, BODY),
        "stale": verify(SECRET, str(int(now) - 301), signature(SECRET, str(int(now) - 301), BODY), BODY),
        "future": verify(SECRET, str(int(now) + 301), signature(SECRET, str(int(now) + 301), BODY), BODY),
        "no prefix": verify(SECRET, ts, good.removeprefix("v1="), BODY),
    }
    assert all(reason is not None for reason in cases.values()), cases
    assert not any(SECRET in reason for reason in cases.values() if reason)
    # Inside the window on both sides is fine.
    edge = str(int(now) - 299)
    assert verify(SECRET, edge, signature(SECRET, edge, BODY), BODY) is None
