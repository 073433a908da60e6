"""The one mapping from the metadata store's errors to the client's (ledger_client.metadata_errors),
and the name check that makes a bad name InvalidNameError before any store call."""

from __future__ import annotations

import pytest

from ledger_client import errors
from ledger_client.metadata_errors import client_error, metadata_errors
from ledger_client.stream.meta import check_names
from metadata import (
    BadVersionError,
    InvalidConnectStringError,
    InvalidMetadataError,
    LedgerAlreadyClosedError,
    LedgerClosedConflict,
    MetadataAccessDeniedError,
    MetadataError,
    MetadataUnavailableError,
    MetadataUpdateConflictError,
    NodeExistsError,
    NoNodeError,
    SessionExpiredError,
    StoreClosedError,
)
from metadata.streams import NamespaceGoneError, StreamGoneError, StreamLockTimeoutError

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("store_error", "client", "says"), [
    (NamespaceGoneError, errors.NoSuchNamespaceError, "op: boom"),       # before its base, StreamGoneError
    (StreamGoneError, errors.NoSuchStreamError, "op: boom"),
    (StreamLockTimeoutError, errors.StreamLockedError, "op: boom"),
    (BadVersionError, errors.MetadataVersionError, "op: metadata changed concurrently (boom)"),
    (MetadataUpdateConflictError, errors.MetadataVersionError, "op: metadata changed concurrently (boom)"),
    (MetadataUnavailableError, errors.MetadataServiceError, "op: ZooKeeper unavailable (boom)"),
    (MetadataAccessDeniedError, errors.UnauthorizedAccessError, "op: boom"),
    (NoNodeError, errors.MetadataServiceError, "op: boom (run `spark-bookie init` first?)"),
    (NodeExistsError, errors.MetadataServiceError, "op: boom"),
    # A bad name never reaches the store (check_names runs first): whatever the message says,
    # an invalid-metadata answer is a metadata failure, not a name error.
    (InvalidMetadataError, errors.MetadataServiceError, "op: boom"),
    (SessionExpiredError, errors.MetadataServiceError, "op: boom"),
    (StoreClosedError, errors.MetadataServiceError, "op: boom"),
    (LedgerClosedConflict, errors.MetadataServiceError, "op: boom"),
    (LedgerAlreadyClosedError, errors.MetadataServiceError, "op: boom"),
    (InvalidConnectStringError, errors.MetadataServiceError, "op: boom"),
    (MetadataError, errors.MetadataServiceError, "op: boom"),
])
def test_each_store_error_becomes_one_client_error(store_error, client, says):
    got = client_error(store_error("boom"), "op")
    assert type(got) is client and str(got) == says


def test_a_name_in_the_message_does_not_make_a_name_error():
    got = client_error(InvalidMetadataError("bad stream name 'a b'"), "op")
    assert type(got) is errors.MetadataServiceError and not isinstance(got, errors.InvalidNameError)


def test_what_a_missing_or_existing_node_means_is_the_callers_to_say():
    missing = client_error(NoNodeError("ledger 7 does not exist"), "read ledger 7", missing_ledger=True)
    assert type(missing) is errors.NoSuchLedgerError
    assert str(missing) == "read ledger 7: no such ledger (ledger 7 does not exist)"
    exists = client_error(NodeExistsError("/streams/ns"), "create namespace ns", exists=errors.NamespaceExistsError)
    assert type(exists) is errors.NamespaceExistsError and str(exists) == "create namespace ns: /streams/ns"
    # ... and only for those: the other errors mean the same whatever the call says
    assert type(client_error(BadVersionError("x"), "op", missing_ledger=True,
                             exists=errors.StreamExistsError)) is errors.MetadataVersionError


def test_the_context_manager_raises_the_mapped_error_with_the_store_error_chained():
    cause = StreamGoneError("gone")
    with pytest.raises(errors.NoSuchStreamError) as caught, metadata_errors("read stream a/b"):
        raise cause
    assert caught.value.__cause__ is cause and str(caught.value) == "read stream a/b: gone"


def test_the_context_manager_lets_other_errors_through():
    with pytest.raises(KeyError), metadata_errors("op"):
        raise KeyError("not the store's")
    with metadata_errors("op"):
        pass


@pytest.mark.parametrize(("name", "what", "error"), [
    ("a b", "stream", errors.InvalidStreamNameError),
    ("..", "namespace", errors.InvalidStreamNameError),
    ("x" * 256, "stream", errors.InvalidStreamNameError),
    ("sub/1", "subscription", errors.InvalidNameError),
    (7, "stream", errors.InvalidStreamNameError),
])
def test_bad_names_are_invalid_name_errors_and_incorrect_parameters(name, what, error):
    with pytest.raises(error) as caught:
        check_names(("good-name", "namespace"), (name, what))
    assert isinstance(caught.value, errors.InvalidNameError)
    assert isinstance(caught.value, errors.IncorrectParameterError)   # what callers caught before
    assert isinstance(caught.value.__cause__, InvalidMetadataError) and str(caught.value).startswith(f"{what} name:")


def test_good_names_pass():
    check_names(("payments", "namespace"), ("orders.v2_A-1", "stream"), ("billing", "subscription"))
