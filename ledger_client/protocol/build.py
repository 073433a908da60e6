"""Generate (or check) the Python code for bookkeeper.proto.

The generated modules are committed so that an installed package works without grpcio-tools;
`--check` fails when they are stale, and `--check-or-generate` (used by scripts/bootstrap)
regenerates them when grpcio-tools is available. Imports are rewritten to be package-relative
because grpc's generator emits `import bookkeeper_pb2`, which breaks inside a package (and inside
Spark's Python workers).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTO = HERE / "bookkeeper.proto"
OUTPUTS = ("bookkeeper_pb2.py", "bookkeeper_pb2.pyi", "bookkeeper_pb2_grpc.py")
STAMP = HERE / "bookkeeper.proto.sha256"


def _proto_hash() -> str:
    return hashlib.sha256(PROTO.read_bytes()).hexdigest()


def generate() -> None:
    from grpc_tools import protoc  # only needed at build time

    with tempfile.TemporaryDirectory() as tmp:
        rc = protoc.main([
            "grpc_tools.protoc", f"-I{HERE}", f"--python_out={tmp}", f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}", str(PROTO),
        ])
        if rc != 0:
            raise SystemExit(f"protoc failed with exit code {rc}")
        for name in OUTPUTS:
            text = (Path(tmp) / name).read_text()
            text = text.replace("import bookkeeper_pb2 as", "from . import bookkeeper_pb2 as")
            (HERE / name).write_text(text)
    STAMP.write_text(_proto_hash() + "\n")


def is_current() -> bool:
    return (STAMP.exists() and STAMP.read_text().strip() == _proto_hash()
            and all((HERE / n).exists() for n in OUTPUTS))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--check", action="store_true", help="exit 1 if generated code is stale")
    ap.add_argument("--check-or-generate", action="store_true",
                    help="regenerate when stale (needs grpcio-tools)")
    args = ap.parse_args(argv)
    if args.check:
        if not is_current():
            print("generated protocol code is stale: run python -m ledger_client.protocol.build",
                  file=sys.stderr)
            return 1
        return 0
    if args.check_or_generate and is_current():
        return 0
    generate()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
