"""MQTT addressing of the control plane: broker URLs, topic names and the broker's user names."""

from dataclasses import dataclass
from urllib.parse import urlsplit

DEFAULT_ROOT = "fedspeech/v1"
DEFAULT_DISCOVERY_PREFIX = "homeassistant"  # Home Assistant's MQTT discovery prefix, unless configured


DEFAULT_PORTS = {"mqtt": 1883, "mqtts": 8883}


def parse_broker_url(url: str) -> tuple[str, int]:
    """(host, port) of an mqtt://host[:port] or, with TLS, mqtts://host[:port] URL."""
    parts = urlsplit(url)
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname:
        raise ValueError(f"broker URL must look like mqtt://host:port or mqtts://host:port, got {url!r}")
    try:
        return parts.hostname, parts.port or DEFAULT_PORTS[parts.scheme]
    except ValueError:
        raise ValueError(f"bad port in broker URL {url!r}") from None


@dataclass(frozen=True)
class Topics:
    """Topic names under one root, so several fleets (or tests) can share a broker."""

    root: str = DEFAULT_ROOT

    def status(self, device_id: str) -> str:
        """Retained device status; the device's last will sets it to offline."""
        return f"{self.root}/devices/{device_id}/status"

    def task(self, device_id: str) -> str:
        """Retained task for one device; cleared when its round closes."""
        return f"{self.root}/devices/{device_id}/task"

    @property
    def all_status(self) -> str:
        """Wildcard the coordinator subscribes to."""
        return f"{self.root}/devices/+/status"

    @property
    def model(self) -> str:
        """Retained announcement of the latest global model."""
        return f"{self.root}/model"

    def detections(self, listener: str) -> str:
        """A listener's detections, one event each (QoS 1, not retained); listener: its broker user."""
        return f"{self.root}/listeners/{listener}/detections"

    def availability(self, listener: str) -> str:
        """A listener's retained "online", or "offline" (its last will); listener: its broker user."""
        return f"{self.root}/listeners/{listener}/availability"

    @property
    def all_listeners(self) -> str:
        """Wildcard of every listener's detections and availability."""
        return f"{self.root}/listeners/#"

    def device_of(self, topic: str) -> str | None:
        """The device id in a device topic, or None if the topic is not one."""
        prefix = f"{self.root}/devices/"
        if not topic.startswith(prefix):
            return None
        parts = topic[len(prefix) :].split("/")
        return parts[0] if len(parts) == 2 and parts[0] else None


def event_discovery(prefix: str, listener: str) -> str:
    """Where a listener's retained Home Assistant discovery config of its event entity goes."""
    return f"{prefix}/event/{listener}/detections/config"


# The broker's users: the coordinator; a device, named by its id; a `fedspeech listen` on it, <id>-listen;
# Home Assistant, reading the listeners' detections.
COORDINATOR_USER, LISTEN_SUFFIX, HOME_ASSISTANT_USER = "coordinator", "-listen", "homeassistant"


def listen_user(device_id: str) -> str:
    """The broker user of a `fedspeech listen` on the device with this id."""
    return f"{device_id}{LISTEN_SUFFIX}"


def shares_a_user(device_id: str) -> bool:
    """Whether a device of this id would log in as the coordinator, Home Assistant or another device's
    listener.
    """
    return device_id in (COORDINATOR_USER, HOME_ASSISTANT_USER) or device_id.endswith(LISTEN_SUFFIX)
