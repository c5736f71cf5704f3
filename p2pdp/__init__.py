"""p2pdp: a simulator for decentralized peer-to-peer federated learning with differential privacy."""

from __future__ import annotations

__version__ = "0.1.0"
