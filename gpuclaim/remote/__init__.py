"""Reaching nodes over SSH: config resolution, host-key checks, pooled connections, fan-out,
and the agent that runs there."""
