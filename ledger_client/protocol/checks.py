"""Production invariant checks.

`assert` disappears under `python -O`; storage code must not. `invariant(cond, msg)` raises
`InvariantViolation` whenever `cond` is false, whatever the interpreter flags.
"""

from __future__ import annotations


class InvariantViolation(RuntimeError):
    """A condition that must hold in production did not: data or state is not what was written."""


def invariant(condition: object, message: str) -> None:
    if not condition:
        raise InvariantViolation(message)
