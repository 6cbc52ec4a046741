"""Plug-ins for agent frameworks that talk to a voxcast server (each an optional extra)."""
