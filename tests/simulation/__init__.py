"""The deterministic simulation: our real send and tracking code under a seeded scheduler
(docs/simulation.md)."""
