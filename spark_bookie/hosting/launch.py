"""The hosting application as a file that spark-submit (or python) can run: what the sandbox
launches, so that it need not reach up into `jobs/`. The public entry is `jobs/bookie_cluster.py`,
the same two lines."""

import sys

from spark_bookie.hosting.driver import main

if __name__ == "__main__":
    sys.exit(main())
