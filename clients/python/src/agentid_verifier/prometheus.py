"""A verifier's counts for ``prometheus_client`` (``pip install agentid-verifier[prometheus]``).

    from prometheus_client import REGISTRY
    from agentid_verifier.prometheus import VerifierCollector
    REGISTRY.register(VerifierCollector(verifier))

Each scrape reads ``verifier.counts()`` and exposes

- ``agentid_verifier_verifications_total{outcome}``: ``valid`` or the refusal's code;
- ``agentid_verifier_fetches_total{document,result}``: ``jwks`` or ``status_list``, and
  ``fetched``, ``not_modified`` or ``failed``.

Every outcome and result is exposed from the start, at 0, so that a rate is defined before
the first refusal. Nothing is counted twice: the counts live in the verifier, and a
collector only reads them.
"""

from __future__ import annotations

from typing import Iterator

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from . import FETCH_DOCUMENTS, FETCH_RESULTS, OUTCOMES, Verifier

__all__ = ["VerifierCollector"]


class VerifierCollector(Collector):
    """Exposes ``verifier``'s counts, each metric's name starting with ``prefix``."""

    def __init__(self, verifier: Verifier, prefix: str = "agentid_verifier"):
        self.verifier = verifier
        self.prefix = prefix

    def collect(self) -> Iterator[CounterMetricFamily]:
        counts = self.verifier.counts()
        verifications = CounterMetricFamily(
            f"{self.prefix}_verifications",
            "Verifications by outcome: valid, or the refusal's code.",
            labels=["outcome"],
        )
        for outcome in OUTCOMES:
            verifications.add_metric([outcome], counts.verifications.get(outcome, 0))
        yield verifications
        fetches = CounterMetricFamily(
            f"{self.prefix}_fetches",
            "Fetches of the key set and status lists by result.",
            labels=["document", "result"],
        )
        for document in FETCH_DOCUMENTS:
            for result in FETCH_RESULTS:
                fetches.add_metric([document, result], counts.fetches.get((document, result), 0))
        yield fetches
