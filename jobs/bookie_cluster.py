"""`spark-submit jobs/bookie_cluster.py --zk Z --bookies N [--data-root D] [--base-port P] ...`

The long-running Spark application whose executors host the bookies (one per executor, in slot
directories under --data-root) and whose driver runs the auditor and reports health. Also runs as
``python jobs/bookie_cluster.py ... --master local-cluster[3,1,1024]``. Everything is in
:mod:`spark_bookie.hosting.driver` (driver) and :mod:`spark_bookie.hosting.slots` (executor tasks); the
arguments are listed by ``--help`` and stay stable (deploy/mesos renders them).
"""

from __future__ import annotations

import sys
from typing import Any

from spark_bookie.hosting.driver import main


def _tier_step() -> Any:
    """jobs.stream_tiering.tier_step (the auditor tiers namespaces that set tier_after_ms), or None
    where pyarrow / deltalake are not installed (the Spark 3.5 path): no tiering there."""
    try:
        from jobs.stream_tiering import tier_step
    except ImportError:
        return None
    return tier_step


if __name__ == "__main__":
    sys.exit(main(tier_step=_tier_step()))
