"""Where things live in ZooKeeper: connect-string parsing and BookKeeper's znode names (pure).

The names match Apache BookKeeper's (``available``, ``cookies``, ``INSTANCEID``, ``LAYOUT``, the
LongHierarchicalLedgerManager's 3-4-4-4-4 ledger paths) so an operator who knows BookKeeper can
read our tree with ``zkCli`` and so the layout could be shared with BookKeeper tooling later.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from metadata.errors import InvalidConnectStringError

DEFAULT_ROOT = "/ledgers"
DEFAULT_PORT = 2181
MAX_LEDGER_ID = 2**63 - 1

AVAILABLE = "available"
READONLY = "readonly"
COOKIES = "cookies"
INSTANCEID = "INSTANCEID"
LAYOUT = "LAYOUT"
UNDERREPLICATION = "underreplication"
IDGEN = "idgen"
IDGEN_LONG = "idgen-long"
DELETED = "deleted"  # markers of ledgers a role deleted, for a bookie to remove (metadata.ledgers)
APPS = "apps"  # data of programs that run the cluster (not BookKeeper's; see ZkLayout.app)
LEDGER_NODE_PREFIX = "L"

# Below ``underreplication`` (BookKeeper's ZkLedgerUnderreplicationManager and AuditorElector).
UR_LEDGERS = "ledgers"
UR_LOCKS = "locks"
UR_DISABLE = "disable"
UR_LOST_BOOKIE_RECOVERY_DELAY = "lostBookieRecoveryDelay"
UR_AUDITOR_ELECTION = "auditorelection"
UR_LEDGER_PREFIX = "urL"
UR_VOTE_PREFIX = "V_"
_UR_BUCKET_RE = re.compile(r"[0-9a-f]{4}")
_UR_LEAF_RE = re.compile(UR_LEDGER_PREFIX + r"(\d{10,19})")
_UR_VOTE_RE = re.compile(re.escape(UR_VOTE_PREFIX) + r"(-?\d{10})")

#: BookKeeper's ledger-layout znode text (LedgerLayout format version 2, then factory:version).
#: We store every ledger id with LongHierarchicalLedgerManager's paths, so we declare that factory.
LAYOUT_TEXT = "2\norg.apache.bookkeeper.meta.LongHierarchicalLedgerManagerFactory:1"

_SPLIT = (3, 4, 4, 4, 4)  # digits per level of the 19-digit zero-padded id
_BUCKET_RE = (re.compile(r"\d{3}"), re.compile(r"\d{4}"), re.compile(r"\d{4}"), re.compile(r"\d{4}"))
_LEAF_RE = re.compile(LEDGER_NODE_PREFIX + r"\d{4}")
_HOST_RE = re.compile(r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9._-]+))(?::(?P<port>\d+))?$")


@dataclass(frozen=True)
class ConnectInfo:
    """A parsed connect string: the ZooKeeper servers and the cluster's root znode."""

    hosts: tuple[str, ...]
    root: str

    @property
    def hosts_string(self) -> str:
        """The servers as kazoo/ZooKeeper expect them (``h1:p1,h2:p2``), without the root."""
        return ",".join(self.hosts)


def parse_connect_string(connect_string: str) -> ConnectInfo:
    """Parse ``host:port[,host:port][/root]`` or ``zk://...``; the root defaults to ``/ledgers``.

    A missing port means 2181. Parsing is strict because a typo here would otherwise surface as a
    connection timeout much later, far from its cause.
    """
    text = connect_string.strip()
    if text.startswith("zk://"):
        text = text[len("zk://") :]
    if not text:
        raise InvalidConnectStringError(f"empty ZooKeeper connect string: {connect_string!r}")
    hosts_part, slash, root_part = text.partition("/")
    hosts = tuple(_parse_host(h.strip(), connect_string) for h in hosts_part.split(","))
    root = _normalise_root("/" + root_part if slash else "", connect_string)
    return ConnectInfo(hosts=hosts, root=root)


def _parse_host(host: str, original: str) -> str:
    match = _HOST_RE.match(host)
    if match is None:
        raise InvalidConnectStringError(f"bad host {host!r} in ZooKeeper connect string {original!r}")
    port = int(match["port"]) if match["port"] else DEFAULT_PORT
    if not 0 < port < 65536:
        raise InvalidConnectStringError(f"bad port {port} in ZooKeeper connect string {original!r}")
    name = f"[{match['v6']}]" if match["v6"] else match["host"]
    return f"{name}:{port}"


def _normalise_root(root: str, original: str) -> str:
    root = root.rstrip("/")
    if not root:
        return DEFAULT_ROOT
    parts = root.split("/")[1:]
    if any(p in ("", ".", "..") for p in parts):
        raise InvalidConnectStringError(f"bad root path {root!r} in ZooKeeper connect string {original!r}")
    return root


def check_ledger_id(ledger_id: int) -> int:
    """Return ``ledger_id`` if it is a valid 63-bit id, else raise ValueError (never a bad path)."""
    if isinstance(ledger_id, bool) or not isinstance(ledger_id, int):
        raise ValueError(f"ledger id must be an int, got {ledger_id!r}")
    if not 0 <= ledger_id <= MAX_LEDGER_ID:
        raise ValueError(f"ledger id {ledger_id} is outside 0..2**63-1")
    return ledger_id


def ledger_path_components(ledger_id: int) -> tuple[str, str, str, str, str]:
    """The five znode names of a ledger (``000``, ``0000``, ``0000``, ``0000``, ``L0001`` for 1).

    Same split as BookKeeper's ``StringUtils.getLongHierarchicalLedgerPath``: the id zero-padded to
    19 digits, cut 3-4-4-4-4, the last part prefixed with ``L`` (at most 10,000 children a node).
    """
    digits = f"{check_ledger_id(ledger_id):019d}"
    parts: list[str] = []
    start = 0
    for width in _SPLIT:
        parts.append(digits[start : start + width])
        start += width
    return parts[0], parts[1], parts[2], parts[3], LEDGER_NODE_PREFIX + parts[4]


def ledger_id_from_components(components: list[str] | tuple[str, ...]) -> int:
    """Inverse of :func:`ledger_path_components`; ValueError if the names are not a ledger path."""
    if len(components) != 5:
        raise ValueError(f"a ledger path has 5 levels below the root, got {list(components)!r}")
    for pattern, name in zip(_BUCKET_RE, components[:4], strict=True):
        if not pattern.fullmatch(name):
            raise ValueError(f"{name!r} is not a ledger bucket name in {list(components)!r}")
    if not _LEAF_RE.fullmatch(components[4]):
        raise ValueError(f"{components[4]!r} is not a ledger node name in {list(components)!r}")
    return check_ledger_id(int("".join(components[:4]) + components[4][1:]))


def is_bucket_name(level: int, name: str) -> bool:
    """Whether ``name`` is a hierarchical bucket at ``level`` (0..3) below the root.

    Level 0 is also where the cluster's own nodes live (``available``, ``cookies``, ...); only
    all-digit names of the right width are buckets, so anything else there is skipped.
    """
    return bool(_BUCKET_RE[level].fullmatch(name))


def is_ledger_node_name(name: str) -> bool:
    """Whether ``name`` is a leaf ledger znode name (``L`` + 4 digits)."""
    return bool(_LEAF_RE.fullmatch(name))


@dataclass(frozen=True)
class ZkLayout:
    """Absolute znode paths of one cluster, rooted at ``root`` (``/ledgers`` by default)."""

    root: str = DEFAULT_ROOT

    @property
    def available(self) -> str:
        return f"{self.root}/{AVAILABLE}"

    @property
    def available_readonly(self) -> str:
        return f"{self.root}/{AVAILABLE}/{READONLY}"

    @property
    def cookies(self) -> str:
        return f"{self.root}/{COOKIES}"

    @property
    def instance_id(self) -> str:
        return f"{self.root}/{INSTANCEID}"

    @property
    def layout(self) -> str:
        return f"{self.root}/{LAYOUT}"

    @property
    def underreplication(self) -> str:
        return f"{self.root}/{UNDERREPLICATION}"

    @property
    def ur_ledgers(self) -> str:
        """Parent of the under-replicated ledgers' hierarchy."""
        return f"{self.underreplication}/{UR_LEDGERS}"

    @property
    def ur_locks(self) -> str:
        """Parent of the replication workers' ephemeral per-ledger locks."""
        return f"{self.underreplication}/{UR_LOCKS}"

    @property
    def ur_disable(self) -> str:
        """Present while re-replication is disabled cluster-wide."""
        return f"{self.underreplication}/{UR_DISABLE}"

    @property
    def ur_lost_bookie_recovery_delay(self) -> str:
        return f"{self.underreplication}/{UR_LOST_BOOKIE_RECOVERY_DELAY}"

    @property
    def auditor_election(self) -> str:
        """Parent of the auditor candidates' ephemeral sequential votes."""
        return f"{self.underreplication}/{UR_AUDITOR_ELECTION}"

    def ur_ledger(self, ledger_id: int) -> str:
        """``<root>/underreplication/ledgers/0000/0000/0000/0001/urL0000000001`` for ledger 1."""
        return self.ur_ledgers + "/" + "/".join(ur_ledger_path_components(ledger_id))

    def ur_lock(self, ledger_id: int) -> str:
        """``<root>/underreplication/locks/urL0000000001`` for ledger 1."""
        return f"{self.ur_locks}/{ur_ledger_node_name(ledger_id)}"

    @property
    def idgen(self) -> str:
        """Parent of the id generator's sequential nodes (BookKeeper's ``idgen-long``)."""
        return f"{self.root}/{IDGEN_LONG}"

    def app(self, key: str) -> str:
        """``<root>/apps/<key>``: a node of the small key-value area that programs running the
        cluster use (e.g. the Spark hosting application's stop request and slot status)."""
        return f"{self.root}/{APPS}/{check_app_key(key)}"

    def bookie(self, bookie_id: str, *, readonly: bool = False) -> str:
        """The ephemeral registration node of a bookie (writable or read-only)."""
        parent = self.available_readonly if readonly else self.available
        return f"{parent}/{check_bookie_id(bookie_id)}"

    def cookie(self, bookie_id: str) -> str:
        return f"{self.cookies}/{check_bookie_id(bookie_id)}"

    def ledger(self, ledger_id: int) -> str:
        """``<root>/000/0000/0000/0000/L0001`` for ledger 1."""
        return self.root + "/" + "/".join(ledger_path_components(ledger_id))

    def ledger_id(self, path: str) -> int:
        """Inverse of :meth:`ledger`; ValueError if ``path`` is not a ledger node of this root."""
        prefix = self.root + "/"
        if not path.startswith(prefix):
            raise ValueError(f"{path!r} is not below the ledger root {self.root!r}")
        return ledger_id_from_components(path[len(prefix) :].split("/"))


def check_bookie_id(bookie_id: str) -> str:
    """Reject ids that would escape their parent znode or collide with ``readonly``."""
    if not bookie_id or "/" in bookie_id or bookie_id in (".", "..", READONLY):
        raise ValueError(f"invalid bookie id {bookie_id!r}")
    return bookie_id


def check_app_key(key: str) -> str:
    """Reject application-data keys that are empty or would leave ``<root>/apps``."""
    parts = key.split("/")
    if not key or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"invalid application data key {key!r} (want names separated by '/')")
    return key


# -- under-replication names ----------------------------------------------------------------------
def ur_ledger_node_name(ledger_id: int) -> str:
    """``urL`` + the id zero-padded to (at least) 10 digits, as BookKeeper's ``urL%010d``."""
    return f"{UR_LEDGER_PREFIX}{check_ledger_id(ledger_id):010d}"


def ur_ledger_path_components(ledger_id: int) -> tuple[str, str, str, str, str]:
    """The five znode names of an under-replicated ledger below ``underreplication/ledgers``.

    BookKeeper's ``ZkLedgerUnderreplicationManager.getUrLedgerZnode``: four buckets of 16 bits of
    the id each, as 4 lower-case hex digits (high bits first), then ``urL%010d``. This differs from
    the ledger metadata's decimal 3-4-4-4-4 split, as it does in BookKeeper.
    """
    lid = check_ledger_id(ledger_id)
    buckets = [f"{(lid >> shift) & 0xFFFF:04x}" for shift in (48, 32, 16, 0)]
    return buckets[0], buckets[1], buckets[2], buckets[3], ur_ledger_node_name(lid)


def is_ur_bucket_name(name: str) -> bool:
    """Whether ``name`` is one of the 4-hex-digit buckets of the under-replicated hierarchy."""
    return bool(_UR_BUCKET_RE.fullmatch(name))


def ur_ledger_id(name: str) -> int | None:
    """The ledger id of an ``urL<digits>`` node (leaf or lock), None for any other name."""
    match = _UR_LEAF_RE.fullmatch(name)
    if match is None:
        return None
    value = int(match[1])
    return value if value <= MAX_LEDGER_ID else None


def vote_sequence(name: str) -> int | None:
    """The sequence number ZooKeeper appended to an auditor vote ``V_<10 digits>``; None otherwise."""
    match = _UR_VOTE_RE.fullmatch(name)
    return None if match is None else int(match[1])
