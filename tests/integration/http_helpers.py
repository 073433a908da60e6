"""Helpers for the HTTP admin and metrics tests: requests with urllib, /metrics parsed by
prometheus_client's own parser."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from prometheus_client.parser import text_string_to_metric_families


def call(url: str, method: str = "GET", body: Any = None, timeout_s: float = 30.0) -> tuple[int, str, str]:
    """(status, content type, body text); an HTTP error status is returned, not raised."""
    data = json.dumps(body).encode() if body is not None and not isinstance(body, bytes) else body
    req = urllib.request.Request(url, data=data, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read().decode()


def call_json(url: str, method: str = "GET", body: Any = None) -> tuple[int, Any]:
    status, ctype, text = call(url, method, body)
    assert ctype.startswith("application/json"), (status, ctype, text)
    return status, json.loads(text)


def scrape(base_url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics: {(sample name, sorted labels): value}."""
    status, ctype, text = call(base_url + "/metrics")
    assert status == 200 and ctype.startswith("text/plain"), (status, ctype)
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def sample(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    assert key in samples, f"{name}{labels} not exported; have {sorted({k[0] for k in samples})}"
    return samples[key]
