"""A device's side of a secure-sum round over HTTP: it agrees keys with the round's other devices before it
trains, and afterwards sends its change and its tally (protocol.secure_tally) masked and gives up the
shares that unmask the sum. The protocol's
steps are edge_client.secure_sum_device's; this module carries them to the coordinator and back, and
waits for each phase to close (a few polls a second, until the task's deadline).
"""

import logging
import time

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedspeech.edge_client.coordinator_http import CoordinatorClient
from fedspeech.edge_client.secure_sum_device import DeviceRound, encode_change
from fedspeech.protocol import secure_sum_maths as ss
from fedspeech.protocol import secure_sum_wire as wire
from fedspeech.protocol.bounds import ProtocolError
from fedspeech.protocol.messages import SecureSum, Task
from fedspeech.protocol.secure_tally import Tally
from fedspeech.protocol.weights import Arrays
from fedspeech.runtime.http_requests import Dropped

log = logging.getLogger(__name__)

POLL_S = 0.25  # between two asks whether a phase has closed


class SecureUpload:
    """One task's part in its round's secure sum: `agree` before training, `send` after it. Dropped (or
    Unwanted) when the round cannot go on with this device; ProtocolError is turned into Dropped.
    """

    def __init__(self, http: CoordinatorClient, task: Task, identity: Ed25519PrivateKey) -> None:
        if task.secure_sum is None:
            raise ValueError("the task asks for no secure sum")
        self.http, self.task, self.settings = http, task, task.secure_sum
        self._round = DeviceRound(http.device_id, task.round, self.settings.threshold, identity)
        self._sharers: list[str] = []
        self._sealed: dict[str, bytes] = {}

    def agree(self) -> None:
        """Advertise this device's keys, check the others' and hand each a share of its secrets."""
        try:
            self._post("adverts", wire.advert_body(self._round.advert()))
            adverts, identities = wire.read_adverts(self._outcome("adverts"), self.task.round)
            self._post("shares", wire.shares_body(self._round.share(adverts, identities)))
            self._sharers, self._sealed = wire.read_sharers(self._outcome("shares"))
        except ProtocolError as exc:
            raise Dropped(f"secure sum of round {self.task.round}: {exc}") from None

    def send(self, received: Arrays, trained: Arrays, tally: Tally) -> int:
        """Send the change from received to trained, clipped, weighted, noised where asked, with the
        device's tally after it, masked; then the shares that unmask the sum. The bytes sent.
        """
        secure: SecureSum = self.settings
        base = {name: received[name] for name in trained if name in received}
        change, norm = ss.change_vector(trained, base, secure.clip)
        if norm > secure.clip:
            log.info("round %d: the change's norm %.4g bounded to %g", self.task.round, norm, secure.clip)
        encoded = np.concatenate(  # noise no seed can replay
            [encode_change(change, norm, secure, np.random.default_rng()), tally.encode()]
        )
        try:
            masked = wire.masked_body(self._round.masked(encoded, self._sharers))
            self._post("masked", masked)
            survivors = wire.read_survivors(self._outcome("masked", secure.unmask_s))
            reply = wire.unmasking_body(self._round.unmask(survivors, self._sealed))
            self._post("unmasking", reply, secure.unmask_s)
        except ProtocolError as exc:
            raise Dropped(f"secure sum of round {self.task.round}: {exc}") from None
        return len(masked) + len(reply)

    def _post(self, phase: str, body: bytes, past_deadline: float = 0.0) -> None:
        self.http.secure_sum(self.task.round, phase, body, self.task.deadline + past_deadline)

    def _outcome(self, phase: str, past_deadline: float = 0.0) -> bytes:
        """A phase's outcome, once it has closed; Dropped at the task's deadline (and past_deadline more)."""
        until = self.task.deadline + past_deadline
        while time.time() < until:
            reply = self.http.secure_sum(self.task.round, phase, None, until)
            if reply is not None:
                return reply
            if self.http.stop.wait(POLL_S):
                break
        raise Dropped(f"the {phase} phase of round {self.task.round} did not close in time")
