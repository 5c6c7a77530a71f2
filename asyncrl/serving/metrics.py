"""The server's Prometheus metrics (`GET /metrics`, text exposition format 0.0.4), counted in process.

    metrics = ServerMetrics()
    metrics.observe_request("/v1/completions", 200, seconds=0.12)
    metrics.observe_tokens(prompt=12, completion=30)
    text = metrics.exposition(running=3, waiting=1, weight_version=2)

Names follow Prometheus' conventions (`_total` counters, `_seconds` histograms) under the `asyncrl_` prefix.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

# Request latency buckets (seconds): a tiny CPU model answers in milliseconds, a long GPU generation in minutes.
LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


@dataclass
class Histogram:
    buckets: tuple[float, ...] = LATENCY_BUCKETS_S
    counts: list[int] = field(default_factory=lambda: [0] * len(LATENCY_BUCKETS_S))
    total: float = 0.0
    count: int = 0

    def observe(self, value: float) -> None:
        for index, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[index] += 1
        self.total += value
        self.count += 1

    def lines(self, name: str, labels: str) -> list[str]:
        """Cumulative buckets, +Inf, sum and count; `labels` like 'route="/v1/completions"'."""
        separator = "," if labels else ""
        lines = [f'{name}_bucket{{{labels}{separator}le="{bound:g}"}} {count}'
                 for bound, count in zip(self.buckets, self.counts)]
        lines.append(f'{name}_bucket{{{labels}{separator}le="+Inf"}} {self.count}')
        lines.append(f"{name}_sum{{{labels}}} {self.total:.6f}")
        lines.append(f"{name}_count{{{labels}}} {self.count}")
        return lines


@dataclass
class ServerMetrics:
    requests: Counter = field(default_factory=Counter)      # (route, status) -> requests answered
    latency: dict[str, Histogram] = field(default_factory=dict)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    num_aborted: int = 0
    num_reloads: int = 0

    def observe_request(self, route: str, status: int, seconds: float) -> None:
        self.requests[(route, status)] += 1
        self.latency.setdefault(route, Histogram()).observe(seconds)

    def observe_tokens(self, prompt: int, completion: int) -> None:
        self.prompt_tokens += prompt
        self.completion_tokens += completion

    def exposition(self, running: int, waiting: int, weight_version: int, is_paused: bool) -> str:
        lines = ["# HELP asyncrl_requests_total HTTP requests answered, by route and status code.",
                 "# TYPE asyncrl_requests_total counter"]
        lines += [f'asyncrl_requests_total{{route="{route}",status="{status}"}} {count}'
                  for (route, status), count in sorted(self.requests.items())]
        lines += ["# HELP asyncrl_request_latency_seconds Time from a request's arrival to its response's start "
                  "(the whole answer unless streamed).", "# TYPE asyncrl_request_latency_seconds histogram"]
        for route, histogram in sorted(self.latency.items()):
            lines += histogram.lines("asyncrl_request_latency_seconds", f'route="{route}"')
        gauges = (("prompt_tokens_total", "counter", "Prompt tokens of answered completions.", self.prompt_tokens),
                  ("generation_tokens_total", "counter", "Tokens generated.", self.completion_tokens),
                  ("aborted_requests_total", "counter", "Requests ended by POST /abort_request.", self.num_aborted),
                  ("weight_reloads_total", "counter", "Weight reloads from a folder.", self.num_reloads),
                  ("num_requests_running", "gauge", "Sequences in the engine's running batch.", running),
                  ("num_requests_waiting", "gauge", "Sequences waiting for admission to the batch.", waiting),
                  ("weight_version", "gauge", "Policy version stamped on new tokens.", weight_version),
                  ("is_paused", "gauge", "1 while generation is paused.", int(is_paused)))
        for name, kind, help_text, value in gauges:
            lines += [f"# HELP asyncrl_{name} {help_text}", f"# TYPE asyncrl_{name} {kind}", f"asyncrl_{name} {value}"]
        return "\n".join(lines) + "\n"
