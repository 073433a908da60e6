"""Who may import whom (the README's layout table, refining DESIGN.md §2), checked from the source.

Every module's imports are read with `ast`, those inside functions and relative ones included;
imports under `if TYPE_CHECKING:` are left out (they never run, so they make no circle). The
rules: an import from one role into another must be allowed by ALLOWED (so jobs/ imports nothing
of the command line, the benches or the local tools: jobs run where those are not installed); no
circle of imports may join modules of different roles; in the packages of ACYCLIC, no circle at
all, even within one role. kazoo is imported only under metadata/zk/. Ledger code does not know
streams exist: nothing in ledger_client/ imports ledger_client.stream but stream/ itself and the
public clients above both (ABOVE_STREAMS).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGES = ("metadata", "ledger_client", "recovery", "spark_bookie", "jobs", "pyspark_ledger")

# Longest prefix wins.
ROLES: dict[str, str] = {
    "metadata": "metadata",
    "ledger_client.protocol": "protocol",
    "ledger_client": "client",
    "recovery": "recovery",
    "spark_bookie": "storage",            # the package itself and its errors module: the bookie's base
    "spark_bookie.storage": "storage",
    "spark_bookie.server": "server",
    "spark_bookie.http": "http",
    "spark_bookie.deploy": "deploy",
    "spark_bookie.hosting": "hosting",
    "spark_bookie.local": "local",
    "spark_bookie.bench": "bench",
    "spark_bookie.cli": "cli",
    "spark_bookie.__main__": "cli",
    "jobs": "jobs",
    "pyspark_ledger": "pyspark_ledger",
}

_BOOKIE = {"storage", "server"}
_LIBS = {"metadata", "protocol", "client", "recovery"}
ALLOWED: dict[str, set[str]] = {
    "metadata": set(),
    "protocol": {"metadata"},
    "client": {"protocol", "metadata"},
    "recovery": {"client", "protocol", "metadata"},
    "storage": {"protocol"},
    "server": {"storage", "protocol", "metadata"},
    "deploy": {"storage"},
    "http": _BOOKIE | _LIBS,
    "hosting": _BOOKIE | _LIBS | {"deploy", "http"},
    "local": _BOOKIE | _LIBS | {"deploy", "hosting", "http"},
    "bench": _BOOKIE | _LIBS | {"deploy", "hosting", "local", "http", "jobs"},   # jobs: the step reporter
    "cli": _BOOKIE | _LIBS | {"deploy", "hosting", "local", "bench", "http", "jobs"},
    "jobs": _BOOKIE | _LIBS | {"deploy", "hosting", "http"},   # never cli, bench or local
    "pyspark_ledger": {"jobs"},
}

# Packages whose modules import each other in no circle at all: every one of ours.
ACYCLIC: frozenset[str] = frozenset(PACKAGES)

MODULE_LINES_MAX = 600   # a module that grows past this is split by role (generated code excepted)

# Streams are built on ledgers, never the other way round: only stream/ and the public surface above
# both import ledger_client.stream (the package, LedgerClient's and AsyncLedgerClient's modules).
STREAMS = "ledger_client.stream"
ABOVE_STREAMS: frozenset[str] = frozenset({"ledger_client", "ledger_client.client", "ledger_client.async_client"})


def role_of(module: str) -> str | None:
    best = None
    for prefix in ROLES:
        if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > len(best)):
            best = prefix
    return None if best is None else ROLES[best]


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node except the bodies of `if TYPE_CHECKING:` blocks."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                stack.extend(child.orelse)
                continue
            stack.append(child)


def imports_of(root: Path, path: Path) -> list[tuple[str, int]]:
    """(imported module, line) for every runtime import of ours or of kazoo in the file."""
    me = module_name(root, path)
    package = me.split(".") if path.name == "__init__.py" else me.split(".")[:-1]
    out: list[tuple[str, int]] = []
    for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from pkg import mod` imports pkg.mod when mod is a module: count the longer name.
            out += [(f"{target}.{a.name}", node.lineno) for a in node.names] or [(target, node.lineno)]
    return [(m, n) for m, n in out if m.split(".")[0] in (*PACKAGES, "kazoo")]


def _resolve(module: str, known: set[str]) -> str:
    """The longest known module a dotted import name refers to (`pkg.mod.Name` -> `pkg.mod`)."""
    parts = module.split(".")
    while parts and ".".join(parts) not in known:
        parts.pop()
    return ".".join(parts) or module


def import_graph(root: Path) -> tuple[dict[str, list[tuple[str, int]]], dict[str, Path]]:
    sources = [p for pkg in PACKAGES if (root / pkg).is_dir() for p in sorted((root / pkg).rglob("*.py"))]
    files = {module_name(root, p): p for p in sources if "_pb2" not in p.name}
    # Generated protobuf modules are not read (they import only protobuf) but they are modules: an
    # import of one is an edge to it, not to its package (which would make a false circle).
    known = set(files) | {module_name(root, p) for p in sources if "_pb2" in p.name}
    graph: dict[str, list[tuple[str, int]]] = {}
    for mod, path in files.items():
        edges = []
        for target, line in imports_of(root, path):
            edges.append((target if target.startswith("kazoo") else _resolve(target, known), line))
        graph[mod] = edges
    return graph, files


def _cycles(graph: dict[str, list[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in graph:
                    continue
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(graph[nxt])))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def _chain(graph: dict[str, list[str]], comp: list[str]) -> str:
    """One circle inside a component, as a -> b -> ... -> a."""
    members = set(comp)
    path = [comp[0]]
    seen = {comp[0]}
    while True:
        nxt = next(t for t in graph[path[-1]] if t in members)
        if nxt in seen:
            return " -> ".join(path[path.index(nxt):] + [nxt])
        path.append(nxt)
        seen.add(nxt)


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _knows_streams(mod: str, target: str) -> bool:
    """A ledger module (in ledger_client/, outside stream/ and the clients above both) importing stream code."""
    return (_in(mod, "ledger_client") and not _in(mod, STREAMS) and mod not in ABOVE_STREAMS
            and _in(target, STREAMS))


def check_layout(root: Path, acyclic: frozenset[str] = ACYCLIC) -> list[str]:
    """Every violation, one line each (empty when the tree keeps the rules); ``acyclic``: the
    top-level packages where even a circle within one role is one."""
    graph, files = import_graph(root)
    problems: list[str] = []
    for mod, edges in sorted(graph.items()):
        src = role_of(mod)
        for target, line in edges:
            where = f"{files[mod].relative_to(root)}:{line}"
            if _knows_streams(mod, target):
                problems.append(f"{where}: {mod} imports {target}: ledger code does not know streams "
                                "(only stream/ and the public clients above both may)")
                continue
            if target.startswith("kazoo"):
                if not mod.startswith("metadata.zk"):
                    problems.append(f"{where}: {mod} imports kazoo (only metadata/zk/ may)")
                continue
            dst = role_of(target)
            if src is None or dst is None or src == dst:
                continue
            if dst not in ALLOWED[src]:
                problems.append(f"{where}: {mod} ({src}) imports {target} ({dst}), which {src} may not")
    plain = {m: [t for t, _ in edges if t in graph] for m, edges in graph.items()}
    for comp in _cycles(plain):
        if len({role_of(m) for m in comp}) > 1:
            problems.append(f"import circle across roles: {_chain(plain, comp)}")
        elif comp[0].split(".")[0] in acyclic:
            problems.append(f"import circle in {comp[0].split('.')[0]}: {_chain(plain, comp)}")
    return problems


def oversized_modules(root: Path, limit: int = MODULE_LINES_MAX) -> list[str]:
    """`path: N lines` for every module of ours (generated protobuf code excepted) over `limit`."""
    out = []
    for pkg in PACKAGES:
        for p in sorted((root / pkg).rglob("*.py")) if (root / pkg).is_dir() else ():
            n = len(p.read_text().splitlines())
            if n > limit and "_pb2" not in p.name:
                out.append(f"{p.relative_to(root)}: {n} lines (over {limit}: split it by role)")
    return out
