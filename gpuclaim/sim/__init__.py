"""Simulated GPUs for tests and the demo sandbox (standard library only)."""
