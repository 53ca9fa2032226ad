"""Runs that fail: why (the failure classes), and what the service does about it."""
