"""Recipes turn a validated run spec into a job launch; see ``base`` and ``registry``."""
