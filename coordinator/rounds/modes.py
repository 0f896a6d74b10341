"""The round modes by name: how a strategy's rounds train, as its `mode` says, or summed securely where
the coordinator is configured for secure aggregation (the strategy's `secure_terms` say how).
"""

from fedspeech.coordinator.rounds import buffered, chained, parallel, secure_sum
from fedspeech.coordinator.rounds.base import RoundMode

MODES: dict[str, RoundMode] = {
    "parallel": parallel.train,
    "buffered": buffered.train,
    "chained": chained.train,
    "secure_sum": secure_sum.train,
}
