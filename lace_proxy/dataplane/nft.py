"""Running nftables: a transaction (data: nftables/transaction.py) applied atomically.

A transaction of set elements only (endpoint changes, periodic syncs, adoption: the bulk of
what the proxy sends) is encoded in-process and sent as one nfnetlink batch
(nftables/netlink.py); the table's structure is read back over netlink too. The rest (the
table's skeleton, chains and rules: rare) goes to the `nft` binary, the stable interface
to the kernel's nf_tables (as knftables uses it): one `nft -f -` call is one netlink
batch. Either way a transaction applies whole or not at all. Nothing here builds a shell
command: argv lists only, and the transaction text is made from validated addresses,
numbers and hashed names.
"""

from __future__ import annotations

import json
import re
import subprocess
from typing import Any, Protocol

from lace_proxy.dataplane.netns import netns_prefix
from lace_proxy.dataplane.nftables.netlink import ElementChannel
from lace_proxy.dataplane.nftables.transaction import Elements, NftError, Transaction

#: What nft prints of a dynamic element's timer ("… timeout 3h expires 2h59m : …").
_TIMERS = re.compile(r" (?:timeout|expires) [0-9dhms]+")


def _json(out: str, what: str) -> dict[str, Any]:
    """nft's JSON output; nft 1.0.6 prints broken JSON for some objects (a table another
    program holds with `flags owner`), which is a clear error, not a parser traceback."""
    try:
        return json.loads(out)
    except json.JSONDecodeError as exc:
        raise NftError(f"nft -j {what}: unreadable output ({exc})", out[-200:]) from exc


class TableListing:
    """`nft list table` output, each map's or set's elements parsed when asked for."""

    _HEADER = re.compile(r"^\t(?:map|set) (\S+) \{$", re.M)

    def __init__(self, text: str) -> None:
        self._text = text
        self._sections: dict[str, tuple[int, int]] = {}
        for match in self._HEADER.finditer(text):
            end = text.find("\n\t}", match.end())
            self._sections[match.group(1)] = (match.end(), end if end >= 0 else len(text))

    def elements(self, name: str) -> list[str]:
        """The elements of map or set `name` in the syntax they are added in, without
        timeout and expiry; none if it has none (or is not in the listing)."""
        start, end = self._sections.get(name, (0, 0))
        first = self._text.find("elements = {", start, end)
        if first < 0:
            return []
        body = self._text[first + len("elements = {") : self._text.rfind("}", first, end)]
        return [_TIMERS.sub("", e.strip()) for e in body.split(",") if e.strip()]


class ElementSource(Protocol):
    """A table's elements, read one map or set at a time."""

    def elements(self, name: str) -> list[str]:
        """The elements of map or set `name` in the renderer's text; none if it has none."""
        ...


class _TableElements:
    def __init__(self, nft: Nft, family: str, table: str) -> None:
        self._nft, self._family, self._table = nft, family, table
        self._listing: TableListing | None = None

    def elements(self, name: str) -> list[str]:
        found = self._nft.set_elements(self._family, self._table, name)
        if found is not None:
            return found
        if self._listing is None:
            self._listing = self._nft.list_table_text(self._family, self._table)
        return [] if self._listing is None else self._listing.elements(name)


class Nft:
    """Runs nft, in the current network namespace or in a named one (for tests and sandboxes)."""

    def __init__(self, netns: str | None = None, binary: str = "nft") -> None:
        self._prefix = netns_prefix(netns)
        self._binary = binary
        self.netns = netns
        self._netlink: ElementChannel | None = None

    def _elements(self) -> ElementChannel:
        """The netlink channel elements go by, made on first use."""
        if self._netlink is None:
            self._netlink = ElementChannel(self.netns)
        return self._netlink

    def _run(self, args: list[str], stdin: str | None = None) -> str:
        proc = subprocess.run(
            [*self._prefix, self._binary, *args],
            input=stdin,
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise NftError(f"nft {' '.join(args)} failed (exit {proc.returncode})", proc.stderr)
        return proc.stdout

    def kernel_seconds(self) -> float:
        """Seconds the kernel has spent on this Nft's netlink batches and dumps so far."""
        return 0.0 if self._netlink is None else self._netlink.kernel_seconds

    def apply(self, tx: Transaction) -> None:
        """Apply the whole transaction atomically, or raise NftError and change nothing.

        A transaction of elements only (what an endpoint change, a periodic sync or an
        adoption sends) is encoded in-process and sent as one nfnetlink batch; anything
        else (chains, rules, sets: rare) is nft's to parse.
        """
        if not tx.commands:
            return
        if tx.elements_only():
            elements = [c for c in tx.commands if isinstance(c, Elements)]
            if self._elements().writes(elements):
                self._elements().apply(elements)
                return
        self._run(["-f", "-"], tx.text())

    def set_elements(self, family: str, table: str, container: str) -> list[str] | None:
        """The elements of one of our maps or sets in the renderer's text, read over netlink
        (None if the kernel has no such map or set, or the codec does not read it)."""
        return self._elements().read(family, table, container)

    def table_objects(self, family: str, table: str) -> dict[str, Any] | None:
        """The table's chains, rules, maps and sets (no elements) in the shape of nft's JSON
        objects, or None if it is absent: read over netlink, dumps of this table alone."""
        return self._elements().table_objects(family, table)

    def table_elements(self, family: str, table: str) -> ElementSource:
        """Where the table's elements are read from, one map or set at a time: over
        netlink; by nft's listing (made once, when first needed) only for the packet path's
        own state, which the codec does not read (the CLI shows it)."""
        return _TableElements(self, family, table)

    def list_table_text(self, family: str, table: str) -> TableListing | None:
        """The table as nft prints it, elements included (one nft run; text is lighter to
        hold than JSON at a million elements), or None if it is absent."""
        try:
            return TableListing(self._run(["list", "table", family, table]))
        except NftError as exc:
            if "No such file or directory" in exc.stderr:
                return None
            raise

    def ruleset(self) -> dict[str, Any]:
        """Every table and chain as nft's JSON objects (terse: no set elements)."""
        return _json(self._run(["-t", "-j", "list", "ruleset"]), "list ruleset")

    def delete_table(self, family: str, table: str) -> bool:
        """Delete the table if it exists; True when something was deleted."""
        try:
            self._run(["delete", "table", family, table])
        except NftError as exc:
            if "No such file or directory" in exc.stderr:
                return False
            raise
        return True
