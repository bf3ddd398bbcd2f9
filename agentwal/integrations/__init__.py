"""Adapters that plug agentwal into agent frameworks (each behind its own optional extra)."""
