"""What a device keeps in its own state folder between runs: its token, broker passwords and identity key
(mode 0600) and the coordinator's key.

The identity key (Ed25519, made on first start) signs the keys the device agrees on in a secure-sum
round; the coordinator learns its public half at registration and hands it to the round's other devices.

The key is pinned on first use: given by the operator (`--coordinator-key`), else the one kept from an
earlier run, else the one the coordinator names when the device first registers. A coordinator that later
names another key is not the one this device enrolled with, and the device refuses to go on.
"""

import logging
from dataclasses import replace
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from fedspeech.protocol import bounds, messages, signing
from fedspeech.protocol.bounds import ProtocolError
from fedspeech.protocol.files import warn_if_readable, write_atomically
from fedspeech.protocol.mqtt import BrokerSettings

log = logging.getLogger(__name__)

TOKEN_FILE, KEY_FILE, IDENTITY_FILE = "token", "coordinator.pub", "identity.pem"
# the broker passwords the coordinator issues with the token, for the device (user: its id) and its
# listener (user: <id>-listen)
BROKER_PASSWORD_FILE, LISTEN_PASSWORD_FILE = "broker-password", "listen-password"
MAX_FILE_BYTES = 1024


class Refused(Exception):
    """The device cannot go on: the coordinator refused it or is not the one it trusts; the text says why."""


class DeviceCredentials:
    """The device's bearer token, its identity key and the coordinator's pinned key, kept in folder;
    Refused if bad.
    """

    def __init__(self, folder: Path, coordinator_key: str | None = None) -> None:
        self.folder = Path(folder)
        try:
            self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise Refused(f"cannot keep this device's credentials in {self.folder}: {exc}") from None
        self.token = self._read_token()
        try:
            self.identity = signing.load_or_create_key(self.folder / IDENTITY_FILE)
        except (OSError, ValueError) as exc:
            path = self.folder / IDENTITY_FILE
            raise Refused(f"{path}: {exc}; remove it to make a new identity key") from None
        kept_key = self._read_key()
        self.key: Ed25519PublicKey | None = kept_key
        if coordinator_key is not None:
            try:
                self.key = signing.parse_public_key(coordinator_key)
            except ProtocolError as exc:
                raise Refused(f"--coordinator-key: {exc}") from None
            if kept_key is None or signing.public_key_text(kept_key) != signing.public_key_text(self.key):
                self._write(KEY_FILE, signing.public_key_text(self.key) + "\n", private=False)

    def _read(self, name: str) -> str | None:
        path = self.folder / name
        try:
            with open(path, "rb") as f:
                return f.read(MAX_FILE_BYTES).decode(errors="replace").strip()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise Refused(f"cannot read {path}: {exc}") from None

    def _write(self, name: str, text: str, private: bool) -> None:
        try:
            write_atomically(self.folder / name, text.encode(), private=private)
        except OSError as exc:
            raise Refused(f"cannot keep {self.folder / name}: {exc}") from None

    def _read_token(self) -> str | None:
        warn_if_readable(self.folder / TOKEN_FILE, "device's token")
        token = self._read(TOKEN_FILE)
        if token is not None and not bounds.TOKEN.match(token):
            log.warning("%s does not hold a token; registering without it", self.folder / TOKEN_FILE)
            return None
        return token

    def _read_key(self) -> Ed25519PublicKey | None:
        text = self._read(KEY_FILE)
        if text is None:
            return None
        try:
            return signing.parse_public_key(text)
        except ProtocolError as exc:
            raise Refused(
                f"{self.folder / KEY_FILE}: {exc}; remove it to trust the key the coordinator names"
            ) from None

    def keep(self, credentials: messages.Credentials, coordinator_url: str) -> None:
        """Keep a new token; pin the coordinator's key if none is yet; Refused if it names another."""
        try:
            named = signing.parse_public_key(credentials.coordinator_key)
        except ProtocolError as exc:
            raise Refused(f"the coordinator at {coordinator_url} names no usable key: {exc}") from None
        if self.key is None:
            self.key = named
            self._write(KEY_FILE, signing.public_key_text(named) + "\n", private=False)
            log.info("pinned the coordinator's key %s in %s", credentials.coordinator_key, self.folder)
        elif signing.public_key_text(named) != signing.public_key_text(self.key):
            pinned, named_text = signing.public_key_text(self.key), credentials.coordinator_key
            message = (
                f"the coordinator at {coordinator_url} signs with key {named_text}, not with the pinned "
                f"key {pinned}: it may be an impostor. If its key really changed, pass the new one with "
                f"--coordinator-key or remove {self.folder / KEY_FILE}"
            )
            log.warning("%s", message)
            raise Refused(message)
        self.token = credentials.token
        self._write(TOKEN_FILE, credentials.token + "\n", private=True)
        issued = {
            BROKER_PASSWORD_FILE: credentials.broker_password,
            LISTEN_PASSWORD_FILE: credentials.listen_password,
        }
        for name, password in issued.items():
            if password is None:
                (self.folder / name).unlink(missing_ok=True)  # the coordinator's broker takes none
            else:
                self._write(name, password + "\n", private=True)

    def broker_login(self, settings: BrokerSettings, device_id: str) -> BrokerSettings:
        """settings with the broker password the coordinator issued, unless the operator gave a login."""
        return issued_login(settings, device_id, self.folder / BROKER_PASSWORD_FILE)


def issued_login(settings: BrokerSettings, user: str, password_file: Path) -> BrokerSettings:
    """settings logging in as user with password_file, if it exists and the operator named no login."""
    if settings.username is not None or settings.password_file is not None or not password_file.is_file():
        return settings
    warn_if_readable(password_file, "broker password")
    log.info("logging in to the broker as %s with the password the coordinator issued", user)
    return replace(settings, username=user, password_file=password_file)
