"""Test support outside the shipped package: the real control plane, testbeds, helpers."""
