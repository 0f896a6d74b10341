"""The secure-sum round in progress, between the HTTP handlers and the round mode: the handlers bring each
device's message of the phase that is open and fetch a closed phase's outcome; the round mode opens the
round, waits on each phase and closes it. A message that fails its checks is refused with the reason and
changes nothing; the round's arithmetic is privacy.secure_sum_server's.
"""

import threading
import time
from collections.abc import Mapping
from typing import Literal

import numpy as np

from fedspeech.coordinator.privacy.secure_sum_server import ServerRound
from fedspeech.coordinator.privacy.sum_suspects import SumSuspects
from fedspeech.coordinator.refusals import BadUpload, NotWanted
from fedspeech.protocol import secure_sum_wire as wire
from fedspeech.protocol.bounds import ProtocolError

Phase = Literal["adverts", "shares", "masked", "unmasking"]
PHASES: tuple[Phase, ...] = ("adverts", "shares", "masked", "unmasking")


class SecureSumUploads:
    """One secure-sum round at a time: open, then wait and close each phase in turn, then total."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._server: ServerRound | None = None
        self._identities: Mapping[str, str] = {}  # device -> its identity key, base64
        self._phase = len(PHASES)  # the open phase's index; len(PHASES): none open
        self._came: set[str] = set()  # the devices whose message of the open phase counts
        # the devices whose message of the open phase was refused, and no good one since: not waited for
        self._refused: set[str] = set()
        self._group: list[str] = []  # the devices the open phase expects a message from
        self._outcomes: dict[Phase, dict[str, bytes]] = {}  # a closed phase's reply to each device
        self.bytes_up = self.bytes_down = 0
        self.suspects = SumSuspects()  # who may have sent a change it did not bound, across rounds

    @property
    def phase(self) -> Phase | None:
        """The phase open now, None between rounds."""
        with self._changed:
            return PHASES[self._phase] if self._server is not None and self._phase < len(PHASES) else None

    # -- the round mode ---------------------------------------------------------------------------

    @property
    def answered(self) -> set[str]:
        """The devices whose message of the open phase has come."""
        with self._changed:
            return set(self._came)

    def open(self, server: ServerRound, identities: Mapping[str, str]) -> None:
        """Start a round: its first phase open to the devices with identities."""
        with self._changed:
            self._server, self._identities = server, dict(identities)
            self._phase, self._came, self._group, self._outcomes = 0, set(), sorted(identities), {}
            self._refused = set()
            self.bytes_up = self.bytes_down = 0

    def wait(self, enough: int, until: float, stop: threading.Event) -> set[str]:
        """Wait until enough devices of the open phase's group sent their message (or all that were not
        refused), the time is up, or stop is set; the devices that did.
        """
        with self._changed:
            while len(self._came) < min(enough, len(self._group) - len(self._refused)) and not stop.is_set():
                left = until - time.time()
                if left <= 0:
                    break
                self._changed.wait(min(left, 0.25))
            return set(self._came)

    def close(self) -> list[str]:
        """Close the open phase; the devices the next one expects. ProtocolError when too few remain."""
        with self._changed:
            server, phase = self._require_server(), PHASES[self._phase]
            try:
                if phase == "adverts":
                    adverts = server.adverts()
                    body = wire.adverts_body(adverts, self._identities)
                    group = [a.device_id for a in adverts]
                    self._outcomes[phase] = dict.fromkeys(group, body)
                elif phase == "shares":
                    group = server.sharers()
                    self._outcomes[phase] = {d: wire.sharers_body(group, server.shares_for(d)) for d in group}
                elif phase == "masked":
                    group = server.survivors()
                    self._outcomes[phase] = dict.fromkeys(group, wire.survivors_body(group))
                else:
                    group = []
            finally:
                self._phase, self._came, self._refused = self._phase + 1, set(), set()
            self._group = group
            self._changed.notify_all()
            return group

    def total(self) -> tuple[np.ndarray, set[str], dict[str, list[str]]]:
        """The sum of the survivors' encoded updates, the devices that gave up wrong shares, and those
        left out of the sum, each with the devices its shares did not open for (ServerRound.total).
        """
        with self._changed:
            return self._require_server().total()

    def end(self) -> None:
        """Take no more messages: the round is over."""
        with self._changed:
            self._server, self._phase, self._outcomes = None, len(PHASES), {}

    # -- the HTTP handlers -----------------------------------------------------------------------

    def body_limit(self, device: str, round: int, phase: Phase) -> int:
        """The largest body a device may send for a phase; NotWanted if it may send none now."""
        with self._changed:
            self._require_open(device, round, phase)
            return 4 * self._require_server().length if phase == "masked" else wire.MAX_BODY_BYTES

    def take(self, device: str, round: int, phase: Phase, body: bytes) -> None:
        """A device's message of the open phase; NotWanted if it is not now, BadUpload if it is bad."""
        with self._changed:
            server = self._require_open(device, round, phase)
            try:
                if phase == "adverts":
                    server.take_advert(wire.read_advert(body, device, round))
                elif phase == "shares":
                    server.take_shares(wire.read_shares(body, device, round))
                elif phase == "masked":
                    server.take_masked(device, wire.read_masked(body, server.length))
                else:
                    server.take_unmasking(wire.read_unmasking(body, device, round))
            except ProtocolError as exc:
                self._refused.add(device)  # a daemon drops out of the round on a refusal
                self._changed.notify_all()
                raise BadUpload(f"{phase} of {device}: {exc}") from None
            self._came.add(device)
            self._refused.discard(device)
            self.bytes_up += len(body)
            self._changed.notify_all()

    def outcome(self, device: str, round: int, phase: Phase) -> bytes | None:
        """A closed phase's reply to a device; None while it is open; NotWanted if it has none for it."""
        with self._changed:
            server = self._server
            if server is None or server.round != round:
                raise NotWanted(f"no secure sum of round {round} is open")
            if PHASES.index(phase) >= self._phase:
                return None
            reply = self._outcomes.get(phase, {}).get(device)
            if reply is None:
                raise NotWanted(f"{device} is not among the devices the {phase} of round {round} went to")
            self.bytes_down += len(reply)
            return reply

    def _require_server(self) -> ServerRound:
        if self._server is None:
            raise ProtocolError("no secure sum is open")
        return self._server

    def _require_open(self, device: str, round: int, phase: Phase) -> ServerRound:
        server = self._server
        if server is None or server.round != round:
            raise NotWanted(f"no secure sum of round {round} is open")
        if self._phase >= len(PHASES) or PHASES[self._phase] != phase:
            raise NotWanted(f"the {phase} of round {round} are not taken now")
        if device not in self._group:
            raise NotWanted(f"{device} is not expected in the {phase} of round {round}")
        if device in self._came:
            raise NotWanted(f"{device} already sent its {phase} for round {round}")
        return server
