"""Add bytecode to pyspark's ``python/lib/pyspark.zip`` (idempotent; run by scripts/bootstrap).

Spark puts that zip first on every Python worker's and data-source runner's path, and Python never
caches bytecode for modules imported from a zip: every such process compiled pyspark again, 0.3-0.4 s
of CPU each (measured 2026-11-26: importing pyspark.sql.worker.write_into_data_source took 0.45 s
from the zip, 0.11 s from the installed package). A Python data source's micro-batch starts several
such processes (planning, writing, committing), so this was a fixed cost of every micro-batch of
the ledger source and sink (docs/benchmarks.md, bench replicate), and of every Spark test.

The zip keeps every source file; beside each ``x.py`` it gains ``x.pyc``, a *checked* hash-based pyc
(PEP 552) that zipimport uses only while it matches the source in the zip, so it can never run
code other than the source's. Made with and for this interpreter's bytecode version.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import warnings
import zipfile
from importlib._bootstrap_external import _code_to_hash_pyc  # type: ignore[attr-defined]
from pathlib import Path


def pyspark_zip() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "python" / "lib" / "pyspark.zip"


def add_bytecode(path: Path) -> int:
    """Rewrite ``path`` with a pyc beside each py; the number added (0: it had them already)."""
    with zipfile.ZipFile(path) as src:
        names = set(src.namelist())
        wanted = [n for n in names if n.endswith(".py") and n + "c" not in names]
        if not wanted:
            return 0
        tmp = path.with_name(path.name + ".tmp")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
            for info in src.infolist():
                data = src.read(info)
                dst.writestr(info, data)
                if info.filename in wanted:
                    with warnings.catch_warnings():   # pyspark's own tests have SyntaxWarnings
                        warnings.simplefilter("ignore")
                        code = compile(data, f"{path}/{info.filename}", "exec", dont_inherit=True)
                    pyc = _code_to_hash_pyc(code, importlib.util.source_hash(data), checked=True)
                    dst.writestr(zipfile.ZipInfo(info.filename + "c", info.date_time), bytes(pyc),
                                 compress_type=zipfile.ZIP_STORED)   # read as is: nothing to inflate
    os.replace(tmp, path)
    return len(wanted)


def main() -> int:
    path = pyspark_zip()
    if not path.exists():
        print(f"pyspark_bytecode: {path} does not exist; nothing to do")
        return 0
    added = add_bytecode(path)
    if added:
        print(f"pyspark_bytecode: {added} modules of {path.name} compiled")
    return 0


if __name__ == "__main__":
    sys.exit(main())
