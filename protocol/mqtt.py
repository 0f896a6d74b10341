"""The project's paho-mqtt client: callback API v2, automatic reconnection with backoff, a retained last will.

Every process that talks to the broker (coordinator, device daemon, listener) makes its client here, so that
connection settings (TLS, user name and password) are decided in one place.
"""

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt

from fedspeech.protocol.topics import parse_broker_url

RECONNECT_MIN_S, RECONNECT_MAX_S = 1, 30
MAX_PASSWORD_BYTES = 1024
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BrokerSettings:
    """Where the broker is and how to log in: mqtt:// or mqtts:// (TLS), user, password, CA, client cert."""

    url: str = "mqtt://127.0.0.1:1883"
    username: str | None = None
    password_file: Path | None = None
    ca_file: Path | None = None  # the CA that signed the broker's certificate (default: the system's)
    cert_file: Path | None = None  # a client certificate, for brokers that ask for one
    key_file: Path | None = None

    @property
    def address(self) -> tuple[str, int]:
        """(host, port); ValueError for a URL that is not a broker's."""
        return parse_broker_url(self.url)

    @property
    def tls(self) -> bool:
        """Whether the connection is encrypted (mqtts://)."""
        return self.url.startswith("mqtts://")

    def check(self) -> None:
        """ValueError, in words a user can act on, for settings that cannot work."""
        self.address  # noqa: B018 - parses the URL
        if self.password_file is not None and not self.username:
            raise ValueError("a broker password file needs a user name")
        if not self.tls and (self.ca_file or self.cert_file):
            raise ValueError(f"a CA or client certificate needs an mqtts:// broker URL, got {self.url}")
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("a client certificate needs its key, and a key its certificate")
        for path in (self.password_file, self.ca_file, self.cert_file, self.key_file):
            if path is not None and not Path(path).is_file():
                raise ValueError(f"no such file: {path}")


@dataclass(frozen=True)
class LastWill:
    """What the broker publishes, retained with QoS 1, when a client vanishes without disconnecting."""

    topic: str
    payload: bytes


def make_client(
    settings: BrokerSettings, client_id: str = "", last_will: LastWill | None = None
) -> mqtt.Client:
    """A paho client that, once started with connect, reconnects by itself; ValueError for bad settings."""
    settings.check()
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id)
    if last_will is not None:
        client.will_set(last_will.topic, last_will.payload, qos=1, retain=True)
    client.reconnect_delay_set(min_delay=RECONNECT_MIN_S, max_delay=RECONNECT_MAX_S)
    # paho retries quietly: without this line a device pointed at a broker that never answers says nothing
    client.on_connect_fail = lambda client, userdata: log.warning(
        "cannot reach the broker at %s; trying again", settings.url
    )
    client.on_connect = lambda client, userdata, flags, reason_code, properties: (
        log.warning("%s", refusal_text(settings, reason_code)) if reason_code.is_failure else None
    )
    if settings.username:
        password = None
        if settings.password_file is not None:
            password = Path(settings.password_file).read_bytes()[:MAX_PASSWORD_BYTES].decode().strip()
        client.username_pw_set(settings.username, password)
    if settings.tls:
        client.tls_set(
            ca_certs=str(settings.ca_file) if settings.ca_file else None,
            certfile=str(settings.cert_file) if settings.cert_file else None,
            keyfile=str(settings.key_file) if settings.key_file else None,
        )
    return client


LOGIN_REFUSALS = ("Not authorized", "Bad user name or password")


def refusal_text(settings: BrokerSettings, reason_code: Any) -> str:
    """A broker's refusal of a connection in words, with what to do where it refused the login."""
    text = f"broker {settings.url} refused the connection: {reason_code}"
    if str(reason_code) not in LOGIN_REFUSALS:
        return text
    return (
        f"{text} (user {settings.username or '(none)'}). Mosquitto run on `fedspeech broker-config`'s "
        "files reads new users only when told: after `fedspeech devices add`, `kill -HUP $(cat "
        "STATE/broker/mosquitto.pid)` on its machine (a new coordinator state needs `fedspeech "
        "broker-config` first); else this user's name or password file is not the broker's"
    )


def connect(client: mqtt.Client, settings: BrokerSettings, keepalive: int = 60) -> None:
    """Connect in the background and start the network thread; paho reconnects with backoff after that."""
    client.connect_async(*settings.address, keepalive=keepalive)
    client.loop_start()


def route(client: mqtt.Client, topic_filter: str, handler: Callable[[mqtt.MQTTMessage], None]) -> None:
    """Call handler (on the network thread) with each message whose topic matches topic_filter."""
    # By topic, not on_message: some brokers (amqtt 0.12) also send retained messages of topics this client
    # never subscribed to.
    client.message_callback_add(topic_filter, lambda client, userdata, message: handler(message))


def add_on_connect(client: mqtt.Client, handler: Callable[[mqtt.Client], None]) -> None:
    """Call handler(client) on each successful connection, after the callbacks added before it; one client
    may serve several parts of a process (one broker login, one last will), each subscribing in its own.
    """
    before: Any = client.on_connect  # paho types it as a union of its API versions' callbacks

    def on_connect(client: mqtt.Client, userdata: Any, flags: Any, reason_code: Any, properties: Any) -> None:
        if before is not None:
            before(client, userdata, flags, reason_code, properties)
        if not reason_code.is_failure:
            handler(client)

    client.on_connect = on_connect
