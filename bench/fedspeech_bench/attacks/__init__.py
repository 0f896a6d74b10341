"""Attacks on a fleet: a live deployment attacked (`bench attacks`), insiders in one process."""
