"""The configuration's one error type, which every layer of it (file, schema, flags) raises."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration problem, located as ``source: path: problem`` for the operator.

    `source` is the file, "override" (a `load_config` override), a flag or "flags"; `path` is the
    dotted camelCase field path ("" for whole-file problems).
    """

    def __init__(self, source: str, path: str, problem: str) -> None:
        self.source = source
        self.path = path
        self.problem = problem
        super().__init__(f"{source}: {path}: {problem}" if path else f"{source}: {problem}")
