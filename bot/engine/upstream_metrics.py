"""Prometheus counters of a remote engine's calls, labelled by the upstream that served them.

The upstream is the base URL a call went to: a replica when the service routes
itself (several ``engine.base_urls``), the router when one sits in front (one
URL; which replica served is then the router's to say, in its own metrics).
Counted per call, not per turn: a turn that failed over counts a failure at one
upstream and a success at the next. Each engine has its own registry (several
apps live in one test process); ``bot.http.ops`` renders it with the app's.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter
from yarl import URL

OK = "ok"


def upstream_label(base_url: str) -> str:
    """``base_url`` without credentials a URL may carry (``http://user:pass@host``)."""
    url = URL(base_url)
    if url.user is None and url.password is None:
        return base_url
    return str(url.with_user(None))


class UpstreamMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.calls = Counter(
            "bot_engine_calls",
            "Generation calls to the engine's upstreams, by outcome: ok, or the error class.",
            ["upstream", "outcome"],
            registry=self.registry,
        )
        self.tokens = Counter(
            "bot_engine_prompt_tokens",
            "Prompt tokens of successful calls by upstream: all of them (prompt), and those "
            "the upstream served from its prefix cache (cached).",
            ["upstream", "kind"],
            registry=self.registry,
        )

    def succeeded(self, base_url: str, prompt_tokens: int, cached_tokens: int) -> None:
        upstream = upstream_label(base_url)
        self.calls.labels(upstream, OK).inc()
        self.tokens.labels(upstream, "prompt").inc(max(0, prompt_tokens))
        self.tokens.labels(upstream, "cached").inc(max(0, cached_tokens))

    def failed(self, base_url: str, error_class: str) -> None:
        self.calls.labels(upstream_label(base_url), error_class).inc()
