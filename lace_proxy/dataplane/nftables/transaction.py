"""What is sent to nf_tables: a transaction, an ordered list of commands applied whole or
not at all, and its refusal.

Data only: the renderer, the backends and the UDP rescue build transactions; the runner
(lace_proxy.dataplane.nft) applies one, a transaction of elements only over netlink
(`netlink.py` encodes its `Elements`), the rest with the nft command. Either way it is
refused with an `NftError`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


class NftError(RuntimeError):
    """The kernel (or nft) refused a transaction; nothing of it was applied."""

    def __init__(self, message: str, stderr: str) -> None:
        super().__init__(f"{message}: {stderr.strip()}")
        self.stderr = stderr


@dataclass(frozen=True)
class Elements:
    """Elements added to one map or set, or (their keys) deleted from it: a command kept as
    data, so that a transaction of elements only goes to the kernel without nft
    (netlink.py encodes it)."""

    verb: str  # "add" | "delete"
    family: str
    table: str
    container: str
    elements: tuple[str, ...]

    def __str__(self) -> str:
        """As nft reads it, the elements sorted (the kernel takes them in any order; a text
        is compared, logged or golden)."""
        body = ", ".join(sorted(self.elements))
        return f"{self.verb} element {self.family} {self.table} {self.container} {{ {body} }}"


@dataclass
class Transaction:
    """An ordered list of nft commands, applied as one atomic batch."""

    commands: list[str | Elements] = field(default_factory=list)

    def add(self, command: str | Elements) -> None:
        self.commands.append(command)

    def extend(self, commands: Iterable[str | Elements]) -> None:
        self.commands.extend(commands)

    def __len__(self) -> int:
        return len(self.commands)

    def lines(self) -> list[str]:
        """Each command as nft reads it."""
        return [str(c) for c in self.commands]

    def text(self) -> str:
        return "\n".join(self.lines()) + "\n"

    def elements_only(self) -> bool:
        """Whether every command adds or deletes elements (nothing for nft to parse)."""
        return all(isinstance(c, Elements) for c in self.commands)
