"""A newline from the network never forges a line in a log: the coordinator's (a URL path, an MQTT status
topic or payload) or the device's (the coordinator's answer), each written through the processes' handler.
"""

import http.client
import io
import json
import logging
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import quote

import paho.mqtt.client as mqtt
import pytest

from fedspeech.coordinator.app import create_app, serve
from fedspeech.edge_client.coordinator_http import CoordinatorClient
from fedspeech.edge_client.credentials import DeviceCredentials
from fedspeech.models.clips.tasks import BUILTIN_TASKS
from fedspeech.protocol import log_lines, messages
from fedspeech.protocol.messages import DeviceStatus, ModelSpec, TaskInfo
from fedspeech.protocol.topics import Topics
from tests.helpers.configs import coordinator_config
from tests.helpers.ports import free_port
from tests.helpers.waiting import wait_for

FORGED = "2026-01-01 00:00:00,000 WARNING fedspeech.coordinator.http.api: forged"
LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ [\w.]+: ")


@pytest.fixture
def log() -> Iterator[io.StringIO]:
    """What the processes' log handler writes while the test runs."""
    stream = io.StringIO()
    handler = log_lines.configure(logging.INFO, stream)
    try:
        yield stream
    finally:
        logging.getLogger().removeHandler(handler)


def _forged_lines(stream: io.StringIO) -> list[str]:
    return [line for line in stream.getvalue().splitlines() if "forged" in line]


def test_a_path_and_an_mqtt_status_with_newlines_are_one_escaped_line_each(tmp_path, topic_root, log):
    (tmp_path / "admin-token").write_text("an-admin-token-of-some-length-0123456789\n")
    # the embedded broker, the README's first one: Mosquitto refuses a topic with control characters
    port = free_port()
    config = coordinator_config(
        tmp_path, broker_port=port, topic_root=topic_root, admin_token_file=tmp_path / "admin-token"
    )
    app = create_app(config)
    service = app.extensions["fedspeech"]
    service.broker.start()
    service.link.start()  # the round loop is left out: only the HTTP API and the broker link are attacked
    server = serve(app, "127.0.0.1", 0)
    publisher = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
    try:
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        connection.request("GET", "/api/devices/kitchen" + quote("\n" + FORGED))
        assert connection.getresponse().status == 401
        connection.close()
        wait_for(lambda: len(_forged_lines(log)) == 1, 10, "the refusal's line")

        topics = Topics(topic_root)
        publisher.connect("127.0.0.1", port)
        publisher.loop_start()
        wait_for(publisher.is_connected, 10, "the connection to the broker")
        wait_for(lambda: service.link._client.is_connected(), 10, "the coordinator's broker link")
        status = json.loads(messages.encode(DeviceStatus("kitchen", "online")))
        bad_topic = topics.status("kitchen\n" + FORGED)
        publisher.publish(bad_topic, json.dumps(status), qos=1).wait_for_publish(5)
        bad_payload = json.dumps({**status, "state": "online\n" + FORGED})
        publisher.publish(topics.status("kitchen"), bad_payload, qos=1).wait_for_publish(5)
        wait_for(lambda: len(_forged_lines(log)) == 3, 10, "the dropped statuses' lines")
    finally:
        publisher.loop_stop()
        publisher.disconnect()
        server.stop()
        service.link.stop()
        service.broker.stop()

    lines = log.getvalue().splitlines()
    assert not any(line.startswith(FORGED) for line in lines), lines
    path, topic, payload = _forged_lines(log)
    assert LINE.match(path) and "GET /api/devices/kitchen\\n2026-01-01" in path
    assert LINE.match(topic) and "dropped malformed status on" in topic and "kitchen\\n2026-01-01" in topic
    assert LINE.match(payload) and "online\\n2026-01-01" in payload


class _Impostor(BaseHTTPRequestHandler):
    """A server in the coordinator's place whose answers hold newlines."""

    def log_message(self, format, *args):
        pass

    def do_GET(self):
        info = json.loads(messages.encode(TaskInfo(BUILTIN_TASKS["fsdd"], ModelSpec("cnn", 8000, 8000, 11))))
        info["spec"]["num_classes"] = "11\n" + FORGED
        body = json.dumps(info).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_an_answer_with_newlines_is_one_escaped_line_in_the_device_log(tmp_path, log):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Impostor)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    stop = threading.Event()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    client = CoordinatorClient(url, "kitchen", stop, DeviceCredentials(tmp_path / "device"))
    asking = threading.Thread(target=client.task_info)
    try:
        asking.start()
        wait_for(lambda: _forged_lines(log), 10, "the device's warning")
    finally:
        stop.set()
        asking.join(10)
        server.shutdown()
        server.server_close()
    (line,) = _forged_lines(log)
    assert LINE.match(line) and "bad task description" in line and "11\\n2026-01-01" in line
    assert not any(line.startswith(FORGED) for line in log.getvalue().splitlines())
