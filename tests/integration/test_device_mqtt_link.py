"""A device's broker session on a broker shared by fleets whose devices share an id."""

import logging
import time
import uuid

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedspeech.edge_client.mqtt_link import BrokerLink
from fedspeech.protocol.messages import DeviceStatus
from fedspeech.protocol.mqtt import BrokerSettings
from fedspeech.protocol.topics import Topics
from tests.helpers.waiting import wait_for


def test_two_fleets_on_one_broker_keep_devices_of_the_same_id_connected(mosquitto_url, caplog):
    """Each fleet's device keeps its session: neither ends the other's, so neither reconnects."""
    caplog.set_level(logging.INFO, logger="fedspeech.edge_client.mqtt_link")
    key = Ed25519PrivateKey.generate().public_key()
    roots = [f"fedspeech-test/{uuid.uuid4().hex[:12]}" for _ in range(2)]
    links = [BrokerLink(BrokerSettings(mosquitto_url), Topics(root), "pi-a", key) for root in roots]
    try:
        for link in links:
            link.start(DeviceStatus("pi-a", "online"))

        def connects() -> int:
            return sum("connected to broker" in r.getMessage() for r in caplog.records)

        wait_for(lambda: connects() >= 2, 10, "both devices connected")
        time.sleep(3)  # paho retries after 1 s: a session ended by the other would be back by now
        assert connects() == 2, "a device's session ended the other's"
        assert not any("disconnected from broker" in r.getMessage() for r in caplog.records)
    finally:
        for link in links:
            link.go_offline()
