"""Wrong admin tokens per client address: a small token bucket each, in bounded memory.

An address may send BURST wrong tokens at once, then one every REFILL_S seconds; beyond that it is told
to wait (HTTP 429), whatever token it sends, so that guessing at the admin token runs at that pace. The
right token costs nothing, and other addresses are never slowed.
"""

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

BURST = 10  # wrong tokens an address may send before it has to wait
REFILL_S = 6.0  # after which it may send one more
MAX_ADDRESSES = 4096  # the longest quiet are forgotten first (a forgotten address starts afresh)


class GuessLimit:
    """How many wrong admin tokens each address may still send; safe to share across threads."""

    def __init__(
        self,
        burst: int = BURST,
        refill_s: float = REFILL_S,
        max_addresses: int = MAX_ADDRESSES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.burst, self.refill_s, self.max_addresses, self._clock = burst, refill_s, max_addresses, clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # address: (tries left, when)
        self._lock = threading.Lock()

    def _left(self, address: str, now: float) -> float:
        left, when = self._buckets.get(address, (self.burst, now))
        return min(float(self.burst), left + (now - when) / self.refill_s)

    def retry_after(self, address: str) -> int:
        """Whole seconds until address may try a token again; 0 if it may now."""
        with self._lock:
            left = self._left(address, self._clock())
        return 0 if left >= 1 else math.ceil((1 - left) * self.refill_s)

    def failed(self, address: str) -> bool:
        """Count a wrong token from address; True if that was its last try for now."""
        with self._lock:
            now = self._clock()
            left = self._left(address, now) - 1
            self._buckets[address] = (left, now)
            self._buckets.move_to_end(address)
            while len(self._buckets) > self.max_addresses:
                self._buckets.popitem(last=False)
        return left < 1

    def __len__(self) -> int:
        """How many addresses are remembered."""
        return len(self._buckets)
