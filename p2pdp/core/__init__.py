"""Foundations every layer uses: errors, seeded random streams, declarative validation, the
component registry, checks at the plug-in boundary, atomic files and shared figure helpers.

Imports nothing else of p2pdp (``.importlinter`` checks the layers).
"""
