"""Spark fixtures: one real ``local-cluster`` session for the whole test run.

Executors are separate JVMs with their own Python workers, so everything a data source or a task
uses must be importable from the installed package (it is: the venv's editable install), and
``PYSPARK_PYTHON`` must be this interpreter.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """A ``local-cluster[2,1,1024]`` session (two executor JVMs), shared by every Spark test."""
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local-cluster[2,1,1024]")
        .appName("spark-bookie-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.memory", "1g")
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("WARN")
    try:
        yield session
    finally:
        session.stop()
