"""The one retry policy of reply-carrying platform calls, on its own (a fake clock)."""

from __future__ import annotations

import aiohttp
import pytest

from bot.channels.delivery_retry import (
    CallFailure,
    DeliveryRetry,
    Network,
    network_failure,
    retry_after_header,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("failure", "transient"),
    [
        (CallFailure(status=502), True),
        (CallFailure(status=500), True),
        (CallFailure(status=429, retry_after=3), True),
        (CallFailure(status=429), True),
        (CallFailure(status=408), True),
        (CallFailure(network=Network.REFUSED), True),
        (CallFailure(network=Network.DROPPED), True),
        (CallFailure(network=Network.TIMEOUT), True),
        (CallFailure(status=400), False),
        (CallFailure(status=401), False),
        (CallFailure(status=403), False),
        (CallFailure(status=404), False),
        (CallFailure(status=302), False),
        (CallFailure(status=200), False),  # Slack's refusals: HTTP 200 and ok: false
    ],
)
def test_what_is_transient(failure: CallFailure, transient: bool) -> None:
    assert failure.transient is transient
    wait = DeliveryRetry(60, clock=Clock()).next_wait(failure)
    assert (wait is not None) is transient


def test_only_a_lost_answer_may_have_landed() -> None:
    assert CallFailure(network=Network.TIMEOUT).may_have_landed
    assert CallFailure(network=Network.DROPPED).may_have_landed
    assert not CallFailure(network=Network.REFUSED).may_have_landed
    assert not CallFailure(status=502).may_have_landed


def test_backoff_doubles_with_jitter_up_to_its_ceiling() -> None:
    clock = Clock()
    low = DeliveryRetry(1000, clock=clock, jitter=lambda: 0.0)
    high = DeliveryRetry(1000, clock=clock, jitter=lambda: 1.0)
    failure = CallFailure(status=503)
    lows = [low.next_wait(failure) for _ in range(7)]
    highs = [high.next_wait(failure) for _ in range(7)]
    assert highs == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert lows == [w / 2 for w in highs]  # never less than half: no busy loop


def test_retry_after_is_honoured_as_given() -> None:
    retry = DeliveryRetry(60, clock=Clock(), jitter=lambda: 1.0)
    assert retry.next_wait(CallFailure(status=429, retry_after=7.0)) == 7.0
    assert retry.next_wait(CallFailure(status=503, retry_after=2.5)) == 2.5


def test_the_budget_counts_the_time_lost_to_failures_of_the_whole_reply() -> None:
    clock = Clock()
    retry = DeliveryRetry(10, clock=clock, jitter=lambda: 1.0)
    assert retry.next_wait(CallFailure(status=429, retry_after=4)) == 4
    clock.now += 4
    retry.succeeded()
    clock.now += 100  # time that went well costs nothing
    assert retry.lost_s == 4
    assert retry.next_wait(CallFailure(status=429, retry_after=5)) == 5
    clock.now += 5
    # 9 s lost: a third wait of 2 s would pass the budget of 10.
    assert retry.next_wait(CallFailure(status=429, retry_after=2)) is None
    assert retry.retries == 2


def test_a_wait_longer_than_the_budget_is_not_made() -> None:
    retry = DeliveryRetry(60, clock=Clock())
    assert retry.next_wait(CallFailure(status=429, retry_after=3600)) is None


def test_network_failures_are_told_apart() -> None:
    assert network_failure(TimeoutError()).network is Network.TIMEOUT
    refused = aiohttp.ClientConnectorError(
        aiohttp.client_reqrep.ConnectionKey("h", 1, False, True, None, None, None),
        OSError(111, "refused"),
    )
    assert network_failure(refused).network is Network.REFUSED
    assert network_failure(aiohttp.ServerDisconnectedError()).network is Network.DROPPED
    assert network_failure(aiohttp.ClientOSError(104, "reset")).network is Network.DROPPED


@pytest.mark.parametrize(
    ("header", "seconds"), [("3", 3.0), ("1.5", 1.5), ("-2", 0.0), ("soon", None), (None, None)]
)
def test_retry_after_header(header: str | None, seconds: float | None) -> None:
    assert retry_after_header(header) == seconds
