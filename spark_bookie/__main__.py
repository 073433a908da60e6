import sys

from spark_bookie.cli.main import main

sys.exit(main())
