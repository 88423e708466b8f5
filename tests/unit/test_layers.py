"""The package's layers run one way: the model is the bottom layer (it imports nothing else of
lace_proxy, the configuration included), no module imports itself back through others (no
import circle anywhere in the package), no module reaches into another module's private
names, and the proxier knows a dataplane only by its contract. Modules stay short enough to
read (one responsibility each). The tests keep to the same rule: no test module imports
another; what two share lives in a kit.

Read from the source with `ast`, so that an import inside a function counts as much as one at
the top: a lazy import is how a circle hides.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "lace_proxy"
MODEL = "lace_proxy.model"


def module_name(path: Path) -> str:
    """The dotted name a file is imported as (a package's __init__.py is the package)."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> Iterator[tuple[str, str | None]]:
    """(module, name) of every import anywhere in the file; name is None for `import module`.
    Relative imports are resolved, so that `from .parse import _x` is seen as what it is."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                package = module_name(path).split(".")
                if path.name != "__init__.py":
                    package.pop()
                base = package[: len(package) - node.level + 1]
                module = ".".join([*base, module] if module else base)
            for alias in node.names:
                yield module, alias.name


def ours(module: str, prefix: str = "lace_proxy") -> bool:
    """`module` is `prefix` or inside it (a bare startswith would take lace_proxy_x too)."""
    return module == prefix or module.startswith(f"{prefix}.")


def private(name: str) -> bool:
    """A leading underscore; dunders such as __version__ are public by convention."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}
MODEL_MODULES = {name: path for name, path in MODULES.items() if ours(name, MODEL)}


@pytest.mark.parametrize("module", sorted(MODEL_MODULES))
def test_the_model_imports_nothing_above_it(module: str) -> None:
    """Not the configuration either: what the model validates against lives in the model."""
    above = {m for m, _ in imports(MODEL_MODULES[module]) if ours(m) and not ours(m, MODEL)}
    assert not above, f"{module} imports {sorted(above)}"


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """What each module imports of lace_proxy: the module named (`from p import m` names the
    submodule m, not the package p), and the packages above it that the import initialises
    first, a package's __init__ being a module as any other. The packages a module is in are
    not: it is imported only once their __init__ has begun."""
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets = graph.setdefault(module, set())
        for imported, name in imports(path):
            if not ours(imported):
                continue
            submodule = f"{imported}.{name}"
            target = submodule if submodule in modules else imported
            parts = target.split(".")
            above = (".".join(parts[:end]) for end in range(1, len(parts)))
            targets.add(target)
            targets.update(p for p in above if p in modules and not ours(module, p))
        targets.discard(module)
    return graph


def test_no_module_imports_itself_back_through_others() -> None:
    """A circle is broken by moving what two modules share below both (as namespace entry
    went to dataplane/netns.py), not hidden by a lazy import: that one counts too."""
    try:
        TopologicalSorter(import_graph(MODULES)).prepare()
    except CycleError as error:  # each module of the circle is imported by the next
        pytest.fail(f"import circle: {' imports '.join(reversed(error.args[1]))}")


def test_no_module_imports_another_modules_private_names() -> None:
    """A helper used by two modules gets a public name (and a docstring) where it lives."""
    found = []
    for module, path in MODULES.items():
        for imported, name in imports(path):
            if name is None or not ours(imported) or imported == module or not private(name):
                continue
            found.append(f"{module}: from {imported} import {name}")
    assert not found, "\n".join(found)


def test_the_proxier_knows_a_dataplane_only_by_its_contract() -> None:
    """lace_proxy.dataplane.base, not a backend: the composition root (app) picks those."""
    backends = ("lace_proxy.dataplane.nftables", "lace_proxy.dataplane.ipvs")
    found = {
        m for m, _ in imports(MODULES["lace_proxy.proxier"]) if any(ours(m, b) for b in backends)
    }
    assert not found, f"lace_proxy.proxier imports {sorted(found)}"


#: About this many lines at most per module (issue 16).
LINES = 600


def test_no_module_grows_past_the_line_limit() -> None:
    lines = {module: len(path.read_text().splitlines()) for module, path in MODULES.items()}
    longer = {module: count for module, count in lines.items() if count > LINES}
    assert not longer, f"split these by responsibility: {longer}"


TESTS = ROOT / "tests"


def test_no_test_module_imports_another() -> None:
    """Importing one runs its module-level code and may collect its tests twice; a helper two
    test modules use goes into a kit (tests/helpers.py, tests/unit/tablekit.py, testkit/)."""
    test_modules = {module_name(path) for path in TESTS.rglob("test_*.py")}
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        for imported, name in imports(path):
            if imported in test_modules or f"{imported}.{name}" in test_modules:
                found.append(f"{module_name(path)} imports {imported} {name or ''}".rstrip())
    assert not found, "\n".join(found)
