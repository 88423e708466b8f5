"""Running nftables: a transaction is data (a list of commands) applied atomically by `nft -f -`.

The `nft` binary is the stable interface to the kernel's nf_tables (as knftables uses it):
one `nft -f -` call is one netlink batch, so a transaction either applies whole or not at
all. Nothing here builds a shell command: argv lists only, and the transaction text is
made from validated addresses, numbers and hashed names.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

NETNS_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def netns_prefix(netns: str | None) -> list[str]:
    """argv prefix that runs a command in a named network namespace (validated), or nothing."""
    if netns is None:
        return []
    if not NETNS_NAME.match(netns):
        raise ValueError(f"invalid network namespace name {netns!r}")
    return ["ip", "netns", "exec", netns]


def enter_netns(name: str) -> None:
    """Move the calling thread into a named network namespace (never creating it: pyroute2's
    default would). Sockets it opens afterwards, and /proc/thread-self/net, are that one's."""
    from pyroute2 import netns

    netns.setns(name, flags=0)


class NftError(RuntimeError):
    """The kernel (or nft) refused a transaction; nothing of it was applied."""

    def __init__(self, message: str, stderr: str) -> None:
        super().__init__(f"{message}: {stderr.strip()}")
        self.stderr = stderr


@dataclass
class Transaction:
    """An ordered list of nft commands, applied as one atomic batch."""

    commands: list[str] = field(default_factory=list)

    def add(self, command: str) -> None:
        self.commands.append(command)

    def extend(self, commands: Iterable[str]) -> None:
        self.commands.extend(commands)

    def __len__(self) -> int:
        return len(self.commands)

    def text(self) -> str:
        return "\n".join(self.commands) + "\n"


#: What nft prints of a dynamic element's timer ("… timeout 3h expires 2h59m : …").
_TIMERS = re.compile(r" (?:timeout|expires) [0-9dhms]+")


def _in_table(item: dict[str, Any], family: str, table: str) -> bool:
    obj = next(iter(item.values()))
    if not isinstance(obj, dict) or obj.get("family") != family:
        return False
    return obj.get("table", obj.get("name") if "table" in item else None) == table


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


class Nft:
    """Runs nft, in the current network namespace or in a named one (for tests and sandboxes)."""

    def __init__(self, netns: str | None = None, binary: str = "nft") -> None:
        self._prefix = netns_prefix(netns)
        self._binary = binary

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

    def apply(self, tx: Transaction) -> None:
        """Apply the whole transaction atomically, or raise NftError and change nothing."""
        if tx.commands:
            self._run(["-f", "-"], tx.text())

    def table_objects(self, family: str, table: str) -> dict[str, Any] | None:
        """The table's chains, rules, maps and sets (no elements) as nft's JSON objects, or
        None if it is absent.

        Read from the terse ruleset: nft lists a whole ruleset without elements in
        milliseconds, but `list table -t` fetches every element first (seconds at 30k
        services). nft 1.0.6 prints broken JSON for a table of another program's with
        `flags owner`; then only our table is listed.
        """
        try:
            raw = self.ruleset()
        except NftError:
            return self._list_table_terse(family, table)
        items = [
            item
            for item in raw.get("nftables", [])
            if _in_table(item, family, table) or "metainfo" in item
        ]
        if not any("table" in item for item in items):
            return None
        return {"nftables": items}

    def _list_table_terse(self, family: str, table: str) -> dict[str, Any] | None:
        try:
            out = self._run(["-t", "-j", "list", "table", family, table])
        except NftError as exc:
            if "No such file or directory" in exc.stderr:
                return None
            raise
        return _json(out, f"list table {family} {table}")

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
