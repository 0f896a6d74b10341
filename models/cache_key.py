"""The names cached files go by: a short digest of everything a cached file depends on."""

import hashlib
import json
from collections.abc import Mapping


def cache_key(made_of: Mapping[str, object]) -> str:
    """A short hex digest of made_of, its keys sorted, anything JSON lacks (a path) written as text."""
    return hashlib.sha256(json.dumps(made_of, sort_keys=True, default=str).encode()).hexdigest()[:16]
