"""A stand-in for a namespace's subscriptions with the client's surface and typed errors
(Namespace.subscriptions, reset_subscription, delete_subscription), for the unit tests of the layers
above the client (the admin API, the CLI): they check their own layer, the client's tests check
the subscriptions."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from ledger_client import DLSN, Namespace, errors

END = DLSN(3, 0, 5)   # the stand-in's streams end here


@dataclass(frozen=True)
class Info:
    name: str
    position: DLSN
    backlog_records: int
    backlog_bytes: int
    updated_ms: int


class FakeSubscriptions:
    """(namespace, stream) -> {name: Info}, behind Namespace's subscription methods."""

    def __init__(self) -> None:
        self.data: dict[tuple[str, str], dict[str, Info]] = {}

    def _of(self, ns: Namespace, stream: str) -> dict[str, Info]:
        ns.view(stream)   # NoSuchStreamError, as the client's
        return self.data.setdefault((ns.name, stream), {})

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        fake = self

        def subscriptions(ns: Namespace, stream: str) -> dict[str, Info]:
            return dict(fake._of(ns, stream))

        def reset_subscription(ns: Namespace, stream: str, name: str, dlsn: DLSN | str) -> None:
            subs = fake._of(ns, stream)
            if name not in subs:
                raise errors.NoSuchSubscriptionError(f"subscription {name} of {ns.name}/{stream} does not exist")
            if isinstance(dlsn, str):   # the client's words
                dlsn = {"earliest": DLSN(1, 0, -1), "latest": END}[dlsn]
            if dlsn > END:
                raise errors.PositionPastEndError(f"position {dlsn} is after the end of {ns.name}/{stream}")
            subs[name] = Info(name, dlsn, 1, 100, 2_000)

        def delete_subscription(ns: Namespace, stream: str, name: str) -> None:
            if fake._of(ns, stream).pop(name, None) is None:
                raise errors.NoSuchSubscriptionError(f"subscription {name} of {ns.name}/{stream} does not exist")

        for f in (subscriptions, reset_subscription, delete_subscription):
            monkeypatch.setattr(Namespace, f.__name__, f, raising=False)
