"""Severities both doctor checks rate their findings with: a problem makes the exit code 1."""

PROBLEM, NOTE = "problem", "note"
#: A node check that passed.
OK = "ok"
