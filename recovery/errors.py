"""Errors of re-replication (auditor, replication worker, decommission).

Metadata-store failures keep their own types (``metadata.errors``) and client failures theirs
(``ledger_client.errors``); these are the decisions recovery itself makes: a fragment that cannot
be copied, a ledger that must wait, a bad configuration, a decommission that ran out of time.
"""

from __future__ import annotations


class RecoveryError(Exception):
    """Base of every error raised by ``recovery``."""


class RecoveryConfigError(RecoveryError, ValueError):
    """An AutoRecoveryConfig value (or a key in its TOML file) is invalid or unknown."""


class ReplicationError(RecoveryError):
    """Copying a fragment failed this time (a source or the target misbehaved, a deadline passed).
    The ledger stays queued and is retried after a backoff."""


class FragmentUnrecoverableError(ReplicationError):
    """No surviving bookie holds a copy of some entry of the fragment: every replica of it is on
    bookies being replaced or unreachable. Retried (a bookie may come back) but logged loudly."""


class OpenFragmentError(RecoveryError):
    """A change that only a finished fragment allows was asked of the last fragment of a ledger
    that is not closed (its writer, or a recovery, may still add entries to it)."""


class DecommissionError(RecoveryError):
    """`recover` / `decommission` could not finish: refused (e.g. the bookie is alive and --force
    was not given) or the data did not move off the bookie before the deadline."""
