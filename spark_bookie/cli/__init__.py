"""The `spark-bookie` command line: argument parsing and one module per command group. It sits
above every other package of the project; nothing imports it."""

from spark_bookie.cli.main import main

__all__ = ["main"]
