"""An LLM engine's metrics under vLLM's names, so tools built for vLLM read a worker unchanged.

Every series has a ``model_name`` label (vLLM's). Histograms are observed by the worker's
OpenAI front as tokens reach the client's stream: ``vllm:time_to_first_token_seconds``
(arrival to the first token), ``vllm:inter_token_latency_seconds`` (each gap between tokens),
``vllm:e2e_request_latency_seconds`` (arrival to the last token), with
``vllm:request_success_total`` by ``finished_reason``. The rest is read from the engines at
each scrape (``bind``): ``vllm:num_requests_running`` / ``_waiting``,
``vllm:kv_cache_usage_perc`` (a fraction, 1 = full, as vLLM's), and the engines' own counters
``vllm:num_preemptions_total``, ``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``,
``vllm:prefix_cache_queries_total`` / ``vllm:prefix_cache_hits_total`` (in tokens), and
``vllm:cache_config_info`` (1, the KV cache's configuration in its labels).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

#: vLLM's buckets (seconds).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip

#: What ``bind``'s reader gives per model at a scrape.
Reading = Mapping[str, float]
#: The engines' counters exported as vLLM's (reading key -> metric name, help).
COUNTERS = (
    ("preemptions", "vllm:num_preemptions", "Cumulative number of preemptions."),
    ("prompt_tokens", "vllm:prompt_tokens", "Number of prefill tokens processed."),
    ("generation_tokens", "vllm:generation_tokens", "Number of generation tokens processed."),
    ("prefix_queries", "vllm:prefix_cache_queries", "Prefix cache queries, in tokens."),
    ("prefix_hits", "vllm:prefix_cache_hits", "Prefix cache hits, in tokens."),
)


class _Engines(Collector):
    def __init__(self, metrics: LlmMetrics) -> None:
        self.m = metrics

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        readings = self.m.read()
        running = GaugeMetricFamily("vllm:num_requests_running",
                                    "Number of requests in model execution batches.",
                                    labels=["model_name"])  # fmt: skip
        waiting = GaugeMetricFamily("vllm:num_requests_waiting",
                                    "Number of requests waiting to be processed.",
                                    labels=["model_name"])  # fmt: skip
        usage = GaugeMetricFamily("vllm:kv_cache_usage_perc",
                                  "KV-cache usage. 1 means 100 percent usage.",
                                  labels=["model_name"])  # fmt: skip
        info = GaugeMetricFamily("vllm:cache_config_info", "Information of the LLMEngine "
                                 "CacheConfig.", labels=["model_name", "block_size",
                                 "num_gpu_blocks", "enable_prefix_caching"])  # fmt: skip
        counters = {key: CounterMetricFamily(name, doc, labels=["model_name"])
                    for key, name, doc in COUNTERS}  # fmt: skip
        for model, r in sorted(readings.items()):
            running.add_metric([model], r["running"])
            waiting.add_metric([model], r["waiting"])
            usage.add_metric([model], r["kv_usage"])
            info.add_metric([model, str(int(r["block_size"])), str(int(r["num_blocks"])),
                             str(bool(r["prefix_caching"]))], 1.0)  # fmt: skip
            for key, c in counters.items():
                c.add_metric([model], r[key])
        yield running
        yield waiting
        yield usage
        yield info
        yield from counters.values()


class LlmMetrics:
    """The vLLM-named series of one worker's LLM models (see the module docstring)."""

    def __init__(self, registry: CollectorRegistry, models: Iterable[str]) -> None:
        r = registry
        self.ttft = Histogram("vllm:time_to_first_token_seconds",
                              "Histogram of time to first token in seconds.", ["model_name"],
                              buckets=TTFT_BUCKETS, registry=r)  # fmt: skip
        self.itl = Histogram("vllm:inter_token_latency_seconds",
                             "Histogram of inter-token latency in seconds.", ["model_name"],
                             buckets=ITL_BUCKETS, registry=r)  # fmt: skip
        self.e2e = Histogram("vllm:e2e_request_latency_seconds",
                             "Histogram of end to end request latency in seconds.",
                             ["model_name"], buckets=E2E_BUCKETS, registry=r)  # fmt: skip
        self.success = Counter("vllm:request_success", "Count of successfully processed "
                               "requests.", ["model_name", "finished_reason"],
                               registry=r)  # fmt: skip
        self.outcomes = Counter("evenserve_worker_llm_requests", "LLM requests answered, by "
                                "outcome (each once).", ["model_name", "outcome"],
                                registry=r)  # fmt: skip
        for m in models:
            self.ttft.labels(m)
            self.itl.labels(m)
            self.e2e.labels(m)
        self._read: Callable[[], Mapping[str, Reading]] = dict
        r.register(_Engines(self))

    def bind(self, read: Callable[[], Mapping[str, Reading]]) -> None:
        """Read the engines with ``read`` at each scrape (model -> reading)."""
        self._read = read

    def read(self) -> Mapping[str, Reading]:
        return self._read()

    def outcome(self, model: str, outcome: str) -> None:
        self.outcomes.labels(model, outcome).inc()

    def finished(self, model: str, reason: str) -> None:
        self.success.labels(model, reason).inc()
