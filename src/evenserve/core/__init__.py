"""Core types, clocks, profiles and typed config. Imports nothing else of evenserve."""
