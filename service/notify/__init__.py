"""Telling people: webhook subscriptions, the outbox written with each event, signed delivery."""
