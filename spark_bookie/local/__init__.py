"""This machine as a cluster: the embedded ZooKeeper (from pyspark's jars), the sandbox of bookie
processes (or of a Spark-hosted cluster), and the demo."""
