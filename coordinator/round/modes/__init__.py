"""How a round trains, by name (MODES): parallel (every device from the global model), buffered
(FedBuff's: late updates count in a later round, kept by Uploads' late_updates) or chained (groups of
devices one after another), as the strategy's `mode` says; or secure_sum where the coordinator is
configured for secure aggregation (the strategy's `secure_terms` say how). Each mode is one function of
the same signature (base.RoundMode).
"""

from fedspeech.coordinator.round.modes import buffered, chained, parallel, secure_sum
from fedspeech.coordinator.round.modes.base import RoundMode

MODES: dict[str, RoundMode] = {
    "parallel": parallel.train,
    "buffered": buffered.train,
    "chained": chained.train,
    "secure_sum": secure_sum.train,
}
