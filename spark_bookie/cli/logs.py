"""JSON-lines logging for long-running processes (`spark-bookie --log-format json ...`).

Why: a log shipper (Loki, Elasticsearch, journald's JSON mode) indexes fields, not free text; and
when many bookies' logs meet in one place, each line must say which process wrote it. Every line
is one JSON object: ts (ISO 8601, UTC, milliseconds), level, logger, msg, the process's identity
under ``bookie_id`` (a bookie's id, an autorecovery candidate's id; set once the command knows
it, ``null`` before) and, for an exception, ``exc`` with its traceback as text.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

FORMATS = ("text", "json")


class _Identity:
    value: str | None = None


def set_log_identity(identity: str) -> None:
    """Name this process in every JSON log line from now on (the bookie id)."""
    _Identity.value = identity


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {
            "ts": datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            "bookie_id": _Identity.value,
            "thread": record.threadName,
        }
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def install_json_logging() -> None:
    """Replace the root handlers' formatters with JsonFormatter (after logging.basicConfig)."""
    for handler in logging.getLogger().handlers:
        handler.setFormatter(JsonFormatter())
