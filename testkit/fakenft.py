"""An nft that runs no nft, for unit tests (as knftables' fake.go): it records every
transaction it is given and applies it to an in-memory model of the tables, so that a
backend's sync logic (apply, full sync, adoption) runs without root or a kernel.

The model keeps what a backend reads back: each table's chains with their rules' text and
comments, and its maps and sets with their elements, keyed as the kernel keys them (a map
by its key, a set by the whole element). It refuses what the kernel refuses of a batch
(objects that do not exist, a chain still jumped to, a map or set still looked up by a
rule, a map key added again with another value), and a batch applies whole or not at all.
Rules are not parsed beyond the names they refer to, and elements are listed back in the
text they were added with (nft prints some its own way, which the backend compares by
meaning).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from lace_proxy.dataplane.nft import ElementSource, Nft, TableListing
from lace_proxy.dataplane.nftables.transaction import NftError, Transaction

#: The names a rule or a verdict refers to.
_CHAIN_REF = re.compile(r"\b(?:jump|goto) ([A-Za-z0-9_.-]+)")
_CONTAINER_REF = re.compile(r"@([A-Za-z0-9_.-]+)")
_COMMENT = re.compile(r'^(.*?)(?: comment "([^"]*)")?$')
_COMMAND = re.compile(r"^(add|delete|flush) (table|chain|rule|set|map|element) (\S+) (\S+) ?(.*)$")
_DECLARATION = re.compile(r"^(map|set) (\S+) \{ (.*) \}$")
_INLINE_ELEMENTS = re.compile(r"elements = \{ ([^}]*) \}; ?")


@dataclass
class FakeChain:
    comment: str | None = None
    hook: str | None = None  # a base chain's `type … hook …;` line
    rules: list[tuple[str, str | None]] = field(default_factory=list)  # (text, comment)


@dataclass
class FakeContainer:
    kind: str  # "map" | "set"
    spec: str
    elements: dict[str, str] = field(default_factory=dict)  # key -> element as added


@dataclass
class FakeTable:
    chains: dict[str, FakeChain] = field(default_factory=dict)
    containers: dict[str, FakeContainer] = field(default_factory=dict)


class Refused(Exception):
    """What the kernel (or nft) would refuse; the batch applies nothing."""


class FakeNft(Nft):
    """Nft's interface over an in-memory model; `refuse_next` makes it refuse batches."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[tuple[str, str], FakeTable] = {}  # (family, name) -> table
        self.applied: list[Transaction] = []  # every non-empty transaction applied, in order
        self.refused: list[Transaction] = []
        self.listings = 0  # how often a table's elements were read
        self._refusals: list[str] = []

    def refuse_next(self, reason: str = "Device or resource busy", count: int = 1) -> None:
        """Refuse the next `count` non-empty transactions whatever they hold."""
        self._refusals += [reason] * count

    def tamper(self, *commands: str) -> None:
        """Change the kernel as another program would: applied, not recorded."""
        _Batch(self.tables).run("\n".join(commands))

    def _run(self, args: list[str], stdin: str | None = None) -> str:
        raise AssertionError(f"the fake runs no nft (nft {' '.join(args)})")

    def apply(self, tx: Transaction) -> None:
        if not tx.commands:
            return
        tables = copy.deepcopy(self.tables)
        try:
            if self._refusals:
                raise Refused(f"Error: Could not process rule: {self._refusals.pop(0)}")
            _Batch(tables).run(tx.text())
        except Refused as exc:
            self.refused.append(tx)
            raise NftError("nft -f - failed (exit 1)", str(exc)) from None
        self.tables = tables
        self.applied.append(tx)

    def table_objects(self, family: str, table: str) -> dict[str, Any] | None:
        held = self.tables.get((family, table))
        if held is None:
            return None
        return {"nftables": list(_objects(family, table, held))}

    def ruleset(self) -> dict[str, Any]:
        return {
            "nftables": [
                item
                for (family, name), held in sorted(self.tables.items())
                for item in _objects(family, name, held)
            ]
        }

    def table_elements(self, family: str, table: str) -> ElementSource:
        self.listings += 1
        held = self.tables.get((family, table), FakeTable())
        return TableListing(_listing(family, table, held))

    def list_table_text(self, family: str, table: str) -> TableListing | None:
        held = self.tables.get((family, table))
        return None if held is None else TableListing(_listing(family, table, held))

    def delete_table(self, family: str, table: str) -> bool:
        return self.tables.pop((family, table), None) is not None


class _Batch:
    """One transaction's commands applied in order, as `nft -f` does; a `table … { … }`
    block makes its sets and chains first, then adds their rules and elements."""

    def __init__(self, tables: dict[tuple[str, str], FakeTable]) -> None:
        self.tables = tables

    def run(self, text: str) -> None:
        lines = iter(enumerate(text.splitlines(), 1))
        for number, line in lines:
            if not line.strip():
                continue
            try:
                if line.startswith("table ") and line.endswith(" {"):
                    _, family, name, _ = line.split()
                    self._block(self.tables.setdefault((family, name), FakeTable()), lines)
                else:
                    self._command(line)
            except Refused as exc:
                where = f"/dev/stdin:{number}: Error: Could not process rule"
                raise Refused(f"{where}: {exc}\n{line}") from None

    def _block(self, table: FakeTable, lines: Iterator[tuple[int, str]]) -> None:
        rules: list[tuple[str, str]] = []
        elements: list[tuple[str, str]] = []
        chain: str | None = None
        for _, raw in lines:
            line = raw.strip()
            if chain is not None:
                if line == "}":
                    chain = None
                elif line.startswith("type ") and " hook " in line:
                    table.chains[chain].hook = line
                else:
                    rules.append((chain, line))
            elif line == "}":
                break
            elif line.startswith("chain ") and line.endswith(" {"):
                chain = line.split()[1]
                table.chains.setdefault(chain, FakeChain())
            elif match := _DECLARATION.match(line):
                kind, name, spec = match.groups()
                inline = _INLINE_ELEMENTS.search(spec)
                spec = _INLINE_ELEMENTS.sub("", spec).strip()
                self._declare(table, kind, name, spec)
                if inline:
                    elements += [(name, e.strip()) for e in inline.group(1).split(",")]
            else:
                raise Refused(f"syntax error in table block: {line}")
        else:
            raise Refused("table block not closed")
        for name, rule in rules:
            self._add_rule(table, name, rule)
        for name, element in elements:
            self._add_element(table, name, element)

    def _command(self, line: str) -> None:
        match = _COMMAND.match(line)
        if not match:
            raise Refused("syntax error")
        verb, what, family, name, rest = match.groups()
        if what == "table":
            if verb == "add":
                self.tables.setdefault((family, name), FakeTable())
            elif verb == "delete":
                self._table(family, name)
                del self.tables[(family, name)]
            else:
                raise Refused(f"{verb} table: not modelled")
            return
        table = self._table(family, name)
        target, _, body = rest.partition(" ")
        if what == "chain":
            self._chain_command(table, verb, target, body)
        elif what == "rule" and verb == "add":
            self._add_rule(table, target, body)
        elif what in ("set", "map"):
            self._container_command(table, verb, what, target, body)
        elif what == "element" and verb in ("add", "delete"):
            container = self._container(table, target)
            for element in _braced(body).split(","):
                if verb == "add":
                    self._add_element(table, target, element.strip())
                elif container.elements.pop(_key(element.strip()), None) is None:
                    raise Refused("No such file or directory")
        else:
            raise Refused(f"{verb} {what}: not modelled")

    def _chain_command(self, table: FakeTable, verb: str, name: str, body: str) -> None:
        if verb == "add":
            comment = re.search(r'comment "([^"]*)"', body)
            chain = table.chains.setdefault(name, FakeChain())
            if chain.comment is None and comment:  # the kernel keeps a chain's first comment
                chain.comment = comment.group(1)
            return
        chain = self._chain(table, name)
        if verb == "flush":
            chain.rules.clear()
            return
        if _chain_referenced(table, name):  # its own rules go with it
            raise Refused("Device or resource busy")
        del table.chains[name]

    def _container_command(
        self, table: FakeTable, verb: str, kind: str, name: str, body: str
    ) -> None:
        if verb == "add":
            self._declare(table, kind, name, _braced(body))
            return
        container = self._container(table, name)
        if container.kind != kind:
            raise Refused("No such file or directory")
        if verb == "flush":
            container.elements.clear()
        elif any(
            name in _CONTAINER_REF.findall(r) for c in table.chains.values() for r, _ in c.rules
        ):
            raise Refused("Device or resource busy")
        else:
            del table.containers[name]

    @staticmethod
    def _declare(table: FakeTable, kind: str, name: str, spec: str) -> None:
        held = table.containers.get(name)
        if held is None:
            table.containers[name] = FakeContainer(kind, spec)
        elif held.kind != kind:
            raise Refused("File exists")

    def _add_rule(self, table: FakeTable, chain: str, rule: str) -> None:
        text, comment = _COMMENT.match(rule).groups()  # type: ignore[union-attr]
        for name in _CHAIN_REF.findall(text):
            self._chain(table, name)
        for name in _CONTAINER_REF.findall(text):
            self._container(table, name)
        self._chain(table, chain).rules.append((text, comment))

    def _add_element(self, table: FakeTable, name: str, element: str) -> None:
        container = self._container(table, name)
        for chain in _CHAIN_REF.findall(element):
            self._chain(table, chain)
        held = container.elements.setdefault(_key(element), element)
        if held != element:
            raise Refused("File exists")

    def _table(self, family: str, name: str) -> FakeTable:
        table = self.tables.get((family, name))
        if table is None:
            raise Refused("No such file or directory")
        return table

    @staticmethod
    def _chain(table: FakeTable, name: str) -> FakeChain:
        if name not in table.chains:
            raise Refused("No such file or directory")
        return table.chains[name]

    @staticmethod
    def _container(table: FakeTable, name: str) -> FakeContainer:
        if name not in table.containers:
            raise Refused("No such file or directory")
        return table.containers[name]


def _braced(body: str) -> str:
    """What is inside `{ … }`."""
    body = body.strip()
    if not (body.startswith("{") and body.endswith("}")):
        raise Refused("syntax error: expected { … }")
    return body[1:-1].strip()


def _key(element: str) -> str:
    """What the kernel keys an element by: a map's key, a set's whole element."""
    return element.split(" : ", 1)[0]


def _chain_referenced(table: FakeTable, name: str) -> bool:
    """A rule jumps to the chain, or a verdict map's element does."""
    rules = (text for chain in table.chains.values() for text, _ in chain.rules)
    elements = (e for c in table.containers.values() for e in c.elements.values())
    return any(name in _CHAIN_REF.findall(text) for text in (*rules, *elements))


def _container_referenced(table: FakeTable, name: str) -> bool:
    """A rule looks the map or set up."""
    rules = (text for chain in table.chains.values() for text, _ in chain.rules)
    return any(name in _CONTAINER_REF.findall(text) for text in rules)


def _objects(family: str, name: str, table: FakeTable) -> Iterator[dict[str, Any]]:
    """The table's objects as Nft.table_objects reads them over netlink (in the shape of
    nft's JSON): without elements, chains with their comments."""
    where = {"family": family, "table": name}
    yield {"table": {"family": family, "name": name}}
    for chain_name, chain in table.chains.items():
        noted = {} if chain.comment is None else {"comment": chain.comment}
        yield {"chain": {**where, "name": chain_name, **noted}}
    for container_name, container in table.containers.items():
        yield {container.kind: {**where, "name": container_name}}
    handle = 0
    for chain_name, chain in table.chains.items():
        for _, comment in chain.rules:
            handle += 1
            extra = {} if comment is None else {"comment": comment}
            yield {"rule": {**where, "chain": chain_name, "handle": handle, **extra}}


def _listing(family: str, name: str, table: FakeTable) -> str:
    """The table as `nft list table` prints it, elements in the text they were added with."""
    lines = [f"table {family} {name} {{"]
    for container_name, container in table.containers.items():
        lines += [f"\t{container.kind} {container_name} {{", f"\t\t{container.spec}"]
        if container.elements:
            lines.append(f"\t\telements = {{ {', '.join(container.elements.values())} }}")
        lines.append("\t}")
    for chain_name, chain in table.chains.items():
        lines.append(f"\tchain {chain_name} {{")
        if chain.comment is not None:
            lines.append(f'\t\tcomment "{chain.comment}"')
        if chain.hook is not None:
            lines.append(f"\t\t{chain.hook}")
        for text, comment in chain.rules:
            lines.append(f'\t\t{text} comment "{comment}"' if comment else f"\t\t{text}")
        lines.append("\t}")
    lines.append("}")
    return "\n".join(lines) + "\n"
