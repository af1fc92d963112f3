"""Discrete-event simulator that drives the very same policy objects as the live system."""
