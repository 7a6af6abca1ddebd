"""Implementations of the plan's scalar functions, grouped by the types they work on."""
