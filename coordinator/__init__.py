"""The coordinator service: HTTP API, round orchestrator, strategies, state store, embedded broker."""
