"""Reading a Prometheus metrics page: every sample, by name and labels."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(text: str) -> Samples:
    """Each sample of the exposition `text`, keyed by its name and its sorted labels."""
    found: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def sample(found: Samples, name: str, **labels: str) -> float:
    """The value of one sample; 0 for a series that does not exist (yet)."""
    return found.get((name, tuple(sorted(labels.items()))), 0.0)


def gauge_by_target(registry: CollectorRegistry) -> dict[str, float]:
    """The suspended gauge's series added up per target, zeros left out."""
    found = samples(generate_latest(registry).decode())
    totals: dict[str, float] = {}
    for (name, labels), amount in found.items():
        if name == "sidestep_suspended" and amount:
            target = dict(labels)["target"]
            totals[target] = totals.get(target, 0.0) + amount
    return totals
