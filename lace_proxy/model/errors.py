"""Rejection of malformed API objects: one precise error per object, logged once, counted."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

_log = logging.getLogger("lace_proxy.model")

#: Longest rendering of an offending value in a message; whole objects can be huge.
_MAX_VALUE_CHARS = 80


def _render(value: Any) -> str:
    """JSON-ish, so strings show their quotes (an empty or padded string is visible)."""
    try:
        text = json.dumps(value, default=str, ensure_ascii=False)
    except ValueError:  # circular structure (YAML aliases can build one)
        text = repr(value)
    if len(text) > _MAX_VALUE_CHARS:
        text = text[: _MAX_VALUE_CHARS - 3] + "..."
    return text


class ValidationError(ValueError):
    """Why one API object (or manifest file) was rejected.

    `code` is a short, stable reason ("invalid_port", "missing_field", ...) for metrics;
    `reason` is the human text. `source` is the manifest file the object came from, if any.
    A `value` of None means the field was absent (or null) and is left out of the message.
    """

    def __init__(
        self,
        kind: str,
        obj: str,
        field: str,
        value: Any,
        reason: str,
        code: str,
        source: str | None = None,
    ) -> None:
        # All arguments go to ValueError so that copy and pickle can rebuild the error.
        super().__init__(kind, obj, field, value, reason, code, source)
        self.kind = kind
        self.object = obj  # "namespace/name", or the name of a cluster-scoped object or file
        self.field = field  # e.g. "spec.ports[1].port"; "" for the object as a whole
        self.value = value
        self.reason = reason
        self.code = code
        self.source = source

    def with_source(self, source: str) -> ValidationError:
        """The same error, attributed to the manifest file it was read from."""
        return ValidationError(
            self.kind, self.object, self.field, self.value, self.reason, self.code, source
        )

    def __str__(self) -> str:
        parts = [f"{self.kind} {self.object}" if self.object else self.kind]
        if self.field:
            parts.append(
                self.field if self.value is None else f"{self.field}={_render(self.value)}"
            )
        parts.append(self.reason)
        text = ": ".join(parts)
        return f"{self.source}: {text}" if self.source else text


class Rejections:
    """Counts rejections per reason code and logs each distinct problem only once.

    Informers re-deliver a broken object on every update and resync; logging each time would
    flood the log, so only a new (kind, object, field, reason) is logged. `counts` is a plain
    dict keyed by `ValidationError.code`, to be exported as a metric.
    """

    def __init__(self, on_reject: Callable[[ValidationError], None] | None = None) -> None:
        self.counts: dict[str, int] = {}
        self._logged: dict[tuple[str, str], set[tuple[str, str]]] = {}
        self._on_reject = on_reject  # e.g. the metrics' counter of rejected objects

    def record(self, error: ValidationError) -> bool:
        """Count `error`; log it unless already logged. Returns whether it was logged."""
        self.counts[error.code] = self.counts.get(error.code, 0) + 1
        if self._on_reject is not None:
            self._on_reject(error)
        problems = self._logged.setdefault((error.kind, error.object), set())
        problem = (error.field, error.reason)
        if problem in problems:
            return False
        problems.add(problem)
        _log.warning("rejected %s", error)
        return True

    def forget(self, kind: str, obj: str) -> None:
        """Drop the log memory of an object that was deleted or fixed.

        Keeps memory bounded under churn of generated names, and lets a later breakage
        of the same object be logged again.
        """
        self._logged.pop((kind, obj), None)
