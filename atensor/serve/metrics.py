"""The server's Prometheus metrics (`GET /metrics`), through prometheus-client.

Why a registry per server rather than prometheus-client's global one: tests and benchmarks start more
than one server in a process, and a metric registered twice in the global registry is an error.

Names follow vLLM's where one exists (`*_prompt_tokens_total`, `*_time_to_first_token_seconds`), under
the `atensor_` prefix:

- atensor_requests_total{endpoint, status}: finished HTTP requests by path and status code
- atensor_prompt_tokens_total, atensor_generation_tokens_total
- atensor_time_to_first_token_seconds, atensor_inter_token_latency_seconds (histograms)
- atensor_requests_running, atensor_requests_waiting, atensor_kv_slots_used (gauges, read when scraped)
- atensor_prefix_cache_hits_total, atensor_prefix_cache_hit_tokens_total
"""
from __future__ import annotations

from typing import Any

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
ITL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class ServerMetrics:
    """Counters, histograms and gauges of one server; `render()` is the text /metrics serves."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("atensor_requests", "HTTP requests by endpoint and status code",
                                ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("atensor_prompt_tokens", "prompt tokens prefilled (cached ones too)",
                                     registry=r)
        self.generation_tokens = Counter("atensor_generation_tokens", "tokens generated", registry=r)
        self.ttft = Histogram("atensor_time_to_first_token_seconds", "from submission to the first token",
                              buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram("atensor_inter_token_latency_seconds", "between a choice's successive tokens",
                             buckets=ITL_BUCKETS, registry=r)
        self.running = Gauge("atensor_requests_running", "choices generating", registry=r)
        self.waiting = Gauge("atensor_requests_waiting", "choices waiting for a slot", registry=r)
        self.slots_used = Gauge("atensor_kv_slots_used", "KV-cache slots in use", registry=r)
        self.prefix_hits = Counter("atensor_prefix_cache_hits", "prompts prefilled from a cached prefix",
                                   registry=r)
        self.prefix_hit_tokens = Counter("atensor_prefix_cache_hit_tokens", "prompt tokens found cached",
                                         registry=r)

    def watch(self, batcher: Any) -> None:
        """Reads the gauges from `batcher` whenever /metrics is scraped."""
        self.running.set_function(lambda: len(batcher.active))
        self.waiting.set_function(lambda: len(batcher.waiting))
        self.slots_used.set_function(lambda: batcher.slots.in_use)

    # ---- the batcher's hooks ----------------------------------------------------------------------------
    def admitted(self, gen: Any) -> None:
        self.prompt_tokens.inc(len(gen.ids))
        if gen.reused:
            self.prefix_hits.inc()
            self.prefix_hit_tokens.inc(gen.reused)

    def token(self, gen: Any, now: float) -> None:
        if gen.last_token_at:
            self.itl.observe(now - gen.last_token_at)
        else:
            self.ttft.observe(now - gen.submitted)

    def finished(self, gen: Any) -> None:
        self.generation_tokens.inc(len(gen.tokens))

    def request(self, endpoint: str, status: int) -> None:
        self.requests.labels(endpoint, str(status)).inc()

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
