"""The emulator's ``/metrics`` renderer (and its NVML sample) read running counters
only: a scrape touches no per-request entry, so its work stays the same however many
requests have finished, and the page still says what the per-request records say
(preemptions included)."""

from __future__ import annotations

from typing import Any, SupportsIndex

from synthetic import make_plant

from gpugov.plant import PlantSimulation
from gpugov.study.emulate.metrics import render_metrics
from gpugov.study.emulate.node import EmulatedNode


class CountingList(list):  # type: ignore[type-arg]
    """A list that counts the entries read from it (indexing, slicing, iterating)."""

    touched = 0

    def __getitem__(self, index: SupportsIndex | slice) -> Any:
        """Count one entry, or every entry a slice covers."""
        if isinstance(index, slice):
            self.touched += len(range(*index.indices(len(self))))
        else:
            self.touched += 1
        return super().__getitem__(index)

    def __iter__(self) -> Any:
        """Count every entry."""
        self.touched += len(self)
        return super().__iter__()


def count_per_request_reads(simulation: PlantSimulation) -> list[CountingList]:
    """Swap every per-request list of ``simulation`` (one entry per request) for a
    :class:`CountingList`; the plant keeps writing into the same objects."""
    count = len(simulation.requests)
    swapped = []
    for name, value in list(vars(simulation).items()):
        if isinstance(value, list) and len(value) == count:
            counting = CountingList(value)
            setattr(simulation, name, counting)
            swapped.append(counting)
    return swapped


def served_node(requests: int) -> EmulatedNode:
    """Two replicas with a small KV cache (so decode growth preempts) that have served
    ``requests`` requests to the end, on a fake clock."""
    now = [0.0]
    node = EmulatedNode(make_plant(kv_capacity_tokens=3000), gpus=2, seed=1, clock=lambda: now[0])
    for k in range(requests):
        node.submit(200 + 37 * (k % 11), 600 + 13 * (k % 7), "length")
        if k % 6 == 5:
            now[0] += 0.5
            node.advance()
    for _ in range(10_000):  # until every request has finished (bounded)
        if sum(sum(stats.finished.values()) for stats in node.stats) == requests:
            break
        now[0] += 2.0
        node.advance()
    return node


def scrape_reads(node: EmulatedNode) -> tuple[int, str]:
    """Per-request entries one daemon scrape reads (the ``/metrics`` page and every
    GPU's NVML sample), and the page."""
    swapped = [lst for sim in node.simulations for lst in count_per_request_reads(sim)]
    page = render_metrics(node, "m")
    for gpu in range(len(node.simulations)):
        assert "power_mw" in node.gpu_sample(gpu)
    return sum(lst.touched for lst in swapped), page


def preemption_samples(page: str) -> list[float]:
    """The ``vllm:num_preemptions_total`` sample of each replica."""
    return [
        float(line.rsplit(" ", 1)[1])
        for line in page.splitlines()
        if line.startswith("vllm:num_preemptions_total{")
    ]


def test_scrape_work_does_not_grow_with_finished_requests() -> None:
    small, large = served_node(12), served_node(240)
    for node, requests in ((small, 12), (large, 240)):
        finished = sum(sum(stats.finished.values()) for stats in node.stats)
        assert finished == requests
        assert sum(len(sim.requests) for sim in node.simulations) == requests
    small_reads, small_page = scrape_reads(small)
    large_reads, large_page = scrape_reads(large)
    assert small_reads == large_reads == 0
    # the counting lists are the plant's own: a read through the plant is seen
    swapped = count_per_request_reads(large.simulations[0])
    large.simulations[0].records()
    assert sum(lst.touched for lst in swapped) >= len(large.simulations[0].requests)
    # the page still carries what the records say (the old per-scrape sum)
    for node, page in ((small, small_page), (large, large_page)):
        expected = [float(sum(r.preemptions for r in sim.records())) for sim in node.simulations]
        assert preemption_samples(page) == expected
    assert sum(preemption_samples(large_page)) > 0  # the large run did preempt


def test_repeated_scrapes_render_the_same_page() -> None:
    node = served_node(30)
    assert render_metrics(node, "m") == render_metrics(node, "m")
