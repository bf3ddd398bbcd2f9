"""Test support that ships with agentwal: failpoints and (soon) the simulated disk."""

from .. import failpoints

__all__ = ["failpoints"]
