"""cluster_health (what `spark-bookie cluster status` prints): a slot's status node outlives its
task, so a slot counts as serving only while its bookie is registered."""

from __future__ import annotations

import json

import pytest

from metadata.memory import InMemoryMetadataStore
from spark_bookie.hosting.health import UNREGISTERED, cluster_health
from spark_bookie.hosting.slots import SERVING, app_key

pytestmark = pytest.mark.unit


def test_a_serving_slot_whose_bookie_is_gone_is_not_counted() -> None:
    store = InMemoryMetadataStore()
    store.cluster.init_cluster()
    for slot, bookie in enumerate(["10.0.0.1:3181", "10.0.0.2:3182"]):
        store.cluster.put_app_data(app_key("c", "slots", str(slot)),
                                   json.dumps({"slot": slot, "bookie_id": bookie, "state": SERVING}).encode())
    store.cluster.register_bookie("10.0.0.1:3181", readonly=False, wait_ms_max=0)
    h = cluster_health(store, "c", 2)
    assert h["slots_serving"] == 1
    assert h["slots"]["0"]["state"] == SERVING
    assert h["slots"]["1"]["state"] == UNREGISTERED
    store.cluster.register_bookie("10.0.0.2:3182", readonly=True, wait_ms_max=0)  # read-only still serves reads
    assert cluster_health(store, "c", 2)["slots_serving"] == 2
