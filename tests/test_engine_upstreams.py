"""Which replica routing applies, and the upstream label a URL's credentials never reach."""

from __future__ import annotations

from bot.engine.routing import ReplicaSet
from bot.engine.upstream_metrics import upstream_label


def test_one_base_url_leaves_the_routing_to_the_upstream() -> None:
    behind_router = ReplicaSet(["http://router:8000/"])
    assert behind_router.routing == "upstream"
    assert behind_router.candidates("conv-1", "r1") == ["http://router:8000"]
    # Even with its breaker open, the lone URL is tried: there is nowhere else to go.
    for _ in range(5):
        behind_router.breakers["http://router:8000"].record_failure()
    assert behind_router.candidates("conv-1", "r2") == ["http://router:8000"]
    assert ReplicaSet(["http://a:8000", "http://b:8000"]).routing == "rendezvous"


def test_the_upstream_label_drops_credentials() -> None:
    assert upstream_label("http://10.0.0.5:8000") == "http://10.0.0.5:8000"
    assert upstream_label("http://user:s3cret@router:8000") == "http://router:8000"
