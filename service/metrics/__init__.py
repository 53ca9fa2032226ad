"""Reward metrics: the console line parser, the point store, and the live broker."""
