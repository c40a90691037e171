"""The emulated ``/metrics`` page against a real vLLM V1 page: the same names, types and
label sets, so ``gpugov run`` against the emulator reads what a real engine serves."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from synthetic import make_plant

from gpugov.study.emulate.metrics import render_metrics
from gpugov.study.emulate.node import EmulatedNode

REAL_PAGE = Path(__file__).parents[1] / "daemon" / "fixtures" / "vllm_v1_real.txt"


def _label_sets(page: str) -> dict[str, set[frozenset[str]]]:
    """Each sample name's label-name sets (the ``le`` of a bucket left out)."""
    out: dict[str, set[frozenset[str]]] = {}
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            keys = frozenset(k for k in sample.labels if k != "le")
            out.setdefault(sample.name, set()).add(keys)
    return out


def _types(page: str) -> dict[str, str]:
    lines = [line.split() for line in page.splitlines() if line.startswith("# TYPE ")]
    return {parts[2]: parts[3] for parts in lines}


def test_every_series_a_real_vllm_serves_has_its_labels_and_type_on_the_emulated_page() -> None:
    """``vllm:cache_config_info`` carried a ``model_name`` label that vLLM's never has
    (its labels are the cache config's and ``engine``); every label set now matches."""
    real_text = REAL_PAGE.read_text()
    emulated_text = render_metrics(EmulatedNode(make_plant()), "m")
    real, emulated = _label_sets(real_text), _label_sets(emulated_text)
    shared = sorted(set(real) & set(emulated))
    assert "vllm:cache_config_info" in shared and "vllm:request_success_total" in shared
    for name in shared:
        if name == "vllm:cache_config_info":  # a subset of the cache config's fields
            assert all(e <= r for e in emulated[name] for r in real[name]), name
        else:
            assert emulated[name] == real[name], name
    emulated_types = _types(emulated_text)
    for name, kind in _types(real_text).items():
        assert emulated_types.get(name) == kind, name


def _vllm_1_2_5_buckets(max_value: int) -> list[float]:
    """vLLM's ``build_1_2_5_buckets(max_model_len)``: 1, 2, 5, 10, ... up to the length."""
    buckets: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return buckets
            buckets.append(float(value))
        exponent += 1


def test_request_length_buckets_end_at_the_model_length_as_vllms_do() -> None:
    """A node serving a model of 8,192 tokens served length buckets up to 100,000, which
    vLLM bounds by the model's length; they now end at 5,000 as vLLM's would."""
    node = EmulatedNode(make_plant(kv_capacity_tokens=8192))
    assert node.max_model_len == 8192
    page = render_metrics(node, "m")
    for name in ("vllm:request_prompt_tokens", "vllm:request_generation_tokens"):
        bounds = [
            float(sample.labels["le"])
            for family in text_string_to_metric_families(page)
            for sample in family.samples
            if sample.name == f"{name}_bucket" and sample.labels["le"] != "+Inf"
        ]
        assert bounds == _vllm_1_2_5_buckets(8192), name


def _pages() -> dict[str, str]:
    """The colocated page and a disaggregated node's two pool pages, a model name with a
    quote and a backslash on each."""
    from gpugov.study.emulate.disaggregated import DisaggregatedNode, render_pool_metrics

    model = 'org/we"ird\\model'
    pools = DisaggregatedNode(make_plant(), prefill_replicas=1, decode_replicas=1)
    return {
        "colocated": render_metrics(EmulatedNode(make_plant(), gpus=2), model),
        "prefill": render_pool_metrics(pools, model, "prefill"),
        "decode": render_pool_metrics(pools, model, "decode"),
    }


def test_counters_are_typed_and_stamped_as_prometheus_client_writes_them() -> None:
    """A counter's ``# TYPE`` named ``vllm:prompt_tokens`` where vLLM's (prometheus_client)
    names ``vllm:prompt_tokens_total``, so a strict parser typed every counter sample
    ``unknown``; and no counter or histogram had the ``_created`` gauge a real page has."""
    for where, page in _pages().items():
        families = {family.name: family for family in text_string_to_metric_families(page)}
        kinds = {name: family.type for name, family in families.items()}
        assert "unknown" not in kinds.values(), (where, kinds)
        counters = [name for name, kind in kinds.items() if kind == "counter"]
        histograms = [name for name, kind in kinds.items() if kind == "histogram"]
        assert "vllm:prompt_tokens" in counters and "vllm:request_success" in counters
        assert "vllm:time_to_first_token_seconds" in histograms
        for name in counters:
            assert f"# TYPE {name}_total counter" in page, (where, name)
            assert {s.name for s in families[name].samples} == {f"{name}_total"}, name
        for name in counters + histograms:
            created = families.get(f"{name}_created")
            assert created is not None and created.type == "gauge", (where, name)
            stamped = [{k: v for k, v in s.labels.items() if k != "le"} for s in created.samples]
            series = [
                {k: v for k, v in s.labels.items() if k != "le"}
                for s in families[name].samples
                if not s.name.endswith("_bucket") or s.labels["le"] == "+Inf"
            ]
            if kinds[name] == "histogram":
                series = series[::3]  # each series' +Inf bucket, _count, _sum
            assert stamped == series, (where, name)
            assert all(s.labels["model_name"] == 'org/we"ird\\model' for s in created.samples)
            assert all(s.value > 1.0e9 for s in created.samples), (where, name)


def test_every_finish_reason_vllm_counts_has_its_series_from_the_start() -> None:
    """vLLM V1 makes ``vllm:request_success_total`` for each of its finish reasons
    (``stop``, ``length``, ``abort``) per engine before any request; the emulated page had
    no ``abort`` series."""
    for where, page in _pages().items():
        reasons: dict[str, set[str]] = {}
        for family in text_string_to_metric_families(page):
            for sample in family.samples:
                if sample.name == "vllm:request_success_total":
                    labels = sample.labels
                    reasons.setdefault(labels["engine"], set()).add(labels["finished_reason"])
                    if labels["finished_reason"] == "abort":
                        assert sample.value == 0.0, where
        assert reasons and all(r == {"stop", "length", "abort"} for r in reasons.values()), where
