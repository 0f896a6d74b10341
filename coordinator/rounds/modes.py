"""The round modes by name: how a strategy's rounds train, as its `mode` says."""

from fedspeech.coordinator.rounds import buffered, chained, parallel
from fedspeech.coordinator.rounds.base import RoundMode
from fedspeech.coordinator.strategies.base import Mode

MODES: dict[Mode, RoundMode] = {
    "parallel": parallel.train,
    "buffered": buffered.train,
    "chained": chained.train,
}
