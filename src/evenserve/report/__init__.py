"""Figures, tables and plots from run records (simulated or live)."""
