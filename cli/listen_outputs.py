"""Where `fedspeech listen`'s detections go besides the terminal: a command (--on-detect) and MQTT events
with Home Assistant discovery (--publish), wired to the runtime's DetectionHook and DetectionPublisher.

On the fleet's broker the publisher shares the model follower's MQTT client (one login, which Mosquitto's
`use_username_as_clientid` allows once, and the publisher's last will); on another broker
(--publish-broker) it has a client of its own.
"""

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import paho.mqtt.client as mqtt

from fedspeech.protocol.mqtt import BrokerSettings, connect, make_client
from fedspeech.protocol.topics import DEFAULT_DISCOVERY_PREFIX, Topics
from fedspeech.runtime.detection_events import DetectionPublisher, check_name, publisher_will
from fedspeech.runtime.detection_hook import DEFAULT_TIMEOUT_S, DetectionHook, check_command
from fedspeech.runtime.session import OnnxModel
from fedspeech.runtime.streaming import Detection

log = logging.getLogger(__name__)


@dataclass
class OutputConfig:
    """The detections' destinations besides the terminal."""

    on_detect: list[str] | None = None  # a command, as argv, run once per detection
    on_detect_timeout_s: float = DEFAULT_TIMEOUT_S
    publish: bool = False
    publish_name: str | None = None  # the listener's broker user, which names its topics
    publish_broker: BrokerSettings | None = None  # None: the broker the models are followed on
    discovery_prefix: str | None = DEFAULT_DISCOVERY_PREFIX  # None: no Home Assistant discovery


@dataclass
class Outputs:
    """The hook and the publisher of a listener, and the MQTT clients they own; `close` ends them."""

    hook: DetectionHook | None = None
    publisher: DetectionPublisher | None = None
    client: mqtt.Client | None = None  # the fleet broker's client, shared with the model follower
    _own_clients: list[mqtt.Client] = field(default_factory=list)

    def on_model(self, model: OnnxModel) -> None:
        """A model starts listening: the publisher's discovery names its words."""
        if self.publisher is not None:
            self.publisher.on_model(model)

    def on_detection(self, detection: Detection, model: OnnxModel) -> None:
        """Hand one detection, heard by model, to the hook and the publisher."""
        if self.publisher is not None:
            self.publisher.on_model(model)  # a Wyoming client's model may be newer than the last one seen
            self.publisher.on_detection(detection)
        if self.hook is not None:
            self.hook(detection)

    def close(self, finish: bool = False) -> None:
        """Say offline, disconnect the clients made here, wait for the running hook (and with finish, run
        the detections queued for it: a file's last words).
        """
        if self.publisher is not None:
            self.publisher.close()
        for client in self._own_clients:
            client.disconnect()
            client.loop_stop()
        if self.hook is not None:
            self.hook.close(finish_queued=finish)


def open_outputs(
    config: OutputConfig,
    broker: BrokerSettings,
    topic_root: str,
    spoken: Callable[[str], str],
    following: bool,
) -> Outputs:
    """The outputs config asks for; ValueError, in words a user can act on, for one that cannot work.

    broker is the one the models are followed on (or the --broker of a local model). Publishing there
    while following, the publisher's client is returned unconnected (as `client`) for the model follower
    to share, and connect; else it is connected here.
    """
    outputs = Outputs()
    if config.on_detect is not None:
        check_command(config.on_detect)
        outputs.hook = DetectionHook(config.on_detect, timeout_s=config.on_detect_timeout_s, spoken=spoken)
    if not config.publish:
        return outputs
    name = config.publish_name
    if not name:
        raise ValueError(
            "--publish needs the listener's broker user, which names its topics: --device-id ID (it "
            "publishes as ID-listen), --publish-username or --broker-username"
        )
    check_name(name, discovery=config.discovery_prefix is not None)
    topics = Topics(topic_root)
    settings = config.publish_broker or broker
    client = make_client(settings, f"fedspeech-listen-{uuid.uuid4().hex[:8]}", publisher_will(name, topics))
    outputs.publisher = DetectionPublisher(client, name, topics, config.discovery_prefix)
    outputs.publisher.attach()
    outputs._own_clients.append(client)
    if config.publish_broker is None and following:
        outputs.client = client
    else:
        connect(client, settings)
    log.info("publishing detections as %s on %s, on %s", name, settings.url, topics.detections(name))
    return outputs
