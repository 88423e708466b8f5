"""Go durations ("30s", "1h2m3.5s"): the configuration's duration fields, read and written
as kube-proxy's Go code reads and writes them, so a file round-trips unchanged."""

from __future__ import annotations

import re
from fractions import Fraction

_DURATION_UNITS_NS = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,  # MICRO SIGN, which Go prints
    "\u03bcs": 1_000,  # GREEK SMALL LETTER MU, which Go also accepts
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
_DURATION_PART = r"([0-9]+\.?[0-9]*|\.[0-9]+)(ns|us|\u00b5s|\u03bcs|ms|s|m|h)"
_DURATION = re.compile(f"(?:{_DURATION_PART})+")
_DURATION_PARTS = re.compile(_DURATION_PART)
_MAX_DURATION_NS = 2**63 - 1  # Go's time.Duration is an int64 of nanoseconds
#: Completes "<value> is ...": what a duration field says of anything else.
NOT_A_DURATION = "not a duration (e.g. 30s, 1m)"


def parse_duration(text: str) -> float:
    """Parse a Go duration ("1h2m3.5s", "500ms", "0") into seconds, refusing negatives.

    Truncates to whole nanoseconds, like Go. Raises ValueError whose text completes the
    sentence "<value> is ...".
    """
    if text.startswith("-"):
        raise ValueError("a negative duration; durations must be 0s or more")
    if text == "0":
        return 0.0
    if not _DURATION.fullmatch(text):
        raise ValueError(NOT_A_DURATION)
    total = sum(
        Fraction(number) * _DURATION_UNITS_NS[unit]
        for number, unit in _DURATION_PARTS.findall(text)
    )
    if total > _MAX_DURATION_NS:
        raise ValueError("longer than the longest Go duration (about 292 years)")
    return int(total) / 1e9


def format_duration(seconds: float) -> str:
    """Render seconds as Go's time.Duration.String() does ("1h0m0s", "1.5s", "500ms")."""
    if seconds < 0:
        raise ValueError(f"negative duration {seconds}")
    ns = round(seconds * 1e9)
    if ns == 0:
        return "0s"
    if ns < 1_000:
        return f"{ns}ns"
    if ns < 1_000_000:
        return _decimal(ns, 1_000) + "\u00b5s"
    if ns < 1_000_000_000:
        return _decimal(ns, 1_000_000) + "ms"
    hours, ns = divmod(ns, 3_600_000_000_000)
    minutes, ns = divmod(ns, 60_000_000_000)
    text = _decimal(ns, 1_000_000_000) + "s"
    if hours or minutes:
        text = f"{minutes}m{text}"
    if hours:
        text = f"{hours}h{text}"
    return text


def _decimal(value: int, unit: int) -> str:
    """`value / unit` in decimal without trailing zeros; `unit` is a power of ten."""
    whole, rest = divmod(value, unit)
    if not rest:
        return str(whole)
    return f"{whole}.{rest:0{len(str(unit)) - 1}d}".rstrip("0")
