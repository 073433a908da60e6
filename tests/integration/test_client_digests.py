"""A replica whose copy fails its digest is skipped, never returned; all bad → DigestMismatchError."""

from __future__ import annotations

import pytest
from bookie_helpers import module_cluster
from client_helpers import client, data

from ledger_client import DigestType, errors
from ledger_client.protocol import bookkeeper_pb2 as pb
from ledger_client.protocol.framing import HEADER_BYTES, Digester, master_key
from ledger_client.transport import BookieClient

pytestmark = pytest.mark.integration

sb = module_cluster(3, "Three bookies for the module: each case writes a ledger of its own by hand.")


def _corrupt(body: bytes) -> bytes:
    """Same header (ids, LAC, length), one payload byte flipped: only the digest can tell."""
    b = bytearray(body)
    b[HEADER_BYTES + 8] ^= 0xFF
    return bytes(b)


@pytest.mark.parametrize("bad_replicas", [1, 2, 3])
def test_corrupt_replicas_are_skipped(sb, bad_replicas):
    with client(sb) as c:
        w = c.create_ledger(3, 3, 2, DigestType.CRC32C, b"pw")
        lid = w.ledger_id
        ensemble = w.metadata.ensembles[0]
        good = Digester(DigestType.CRC32C, b"pw").frame(lid, 0, -1, 64, data(lid, 0))
        # Entry 0 written by hand: the first `bad_replicas` bookies get a corrupted copy.
        for i, b in enumerate(ensemble):
            with BookieClient(b) as bc:
                body = _corrupt(good) if i < bad_replicas else good
                assert bc.add(lid, 0, master_key(b"pw"), body).result(10).status == pb.EOK
        r = c.open_ledger(lid, b"pw", recovery=False)
        if bad_replicas < 3:
            for _ in range(5):  # whichever replica is asked first, the answer is the good copy
                assert r.read_unconfirmed(0, 0)[0].data == data(lid, 0)
        else:
            with pytest.raises(errors.DigestMismatchError):
                r.read_unconfirmed(0, 0)
