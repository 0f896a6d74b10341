"""Who may ask what, with an admin token configured: each route's answer to no token, a device's token
and the admin token; one answer for enrolled and unknown ids; wrong admin tokens limited per address."""

import base64
import itertools

import pytest

from fedspeech.coordinator.app import create_app
from fedspeech.coordinator.fleet.enrolment import add_device, revoke_device
from fedspeech.coordinator.http.wrong_tokens import BURST, GuessLimit
from fedspeech.coordinator.state.records import RoundRecord
from fedspeech.protocol import messages, weights
from fedspeech.protocol.messages import Credentials, Profile, Registration
from tests.helpers.configs import coordinator_config

ADMIN = "an-admin-token-of-some-length-0123456789"
_addresses = (f"10.0.{i // 250}.{i % 250 + 1}" for i in itertools.count())


def _app(tmp_path, **settings):
    (tmp_path / "admin-token").write_text(ADMIN + "\n")
    config = coordinator_config(
        tmp_path, broker="mqtt://127.0.0.1:1883", admin_token_file=tmp_path / "admin-token", **settings
    )
    app = create_app(config)
    store = app.extensions["fedspeech"].store
    blob = b"weights of round 0"
    store.save_round(
        RoundRecord(0, 1.0, 2.0, 1.0, 0, 0, 0.1, 0.1, 2.3, 0, 0, weights.sha256(blob)), blob, b"onnx", []
    )
    return app


def _register(http, device_id: str, credential: str | None = None, **environ):
    body = messages.encode(Registration(device_id, 20, Profile(2, 0.0, 512.0)))
    headers = {"Authorization": f"Bearer {credential}"} if credential else {}
    return http.post("/api/devices", data=body, headers=headers, environ_base=environ)


@pytest.fixture
def fleet(tmp_path):
    """A coordinator with an admin token and one registered device, kitchen: (app, kitchen's token)."""
    app = _app(tmp_path)
    secret = add_device(app.extensions["fedspeech"].store, "kitchen")
    reply = _register(app.test_client(), "kitchen", secret)
    return app, messages.decode(reply.data, Credentials).token


PAST = "past the token check"
# (method, path): the status with no token, with kitchen's token, with the admin token
ROUTES = {
    # public: a device needs them before it holds a token, or a listener that holds none
    ("GET", "/api/key"): (200, 200, 200),
    ("GET", "/api/task"): (200, 200, 200),
    ("GET", "/api/models/0/weights"): (200, 200, 200),
    ("GET", "/api/models/0/onnx"): (200, 200, 200),
    ("GET", "/api/status"): (200, 200, 200),  # the round numbers; devices and broker to the admin only
    # the operator's
    ("GET", "/api/models/latest"): (401, 401, 200),
    ("GET", "/api/devices"): (401, 401, 200),
    ("GET", "/api/rounds"): (401, 401, 200),
    ("GET", "/api/rounds/0"): (401, 401, 200),
    ("GET", "/api/overview"): (401, 401, 200),
    ("GET", "/"): (401, 401, 200),
    ("GET", "/assets/dashboard.js"): (401, 401, 200),
    ("GET", "/metrics"): (401, 401, 200),
    ("DELETE", "/api/devices/hall"): (401, 401, 200),
    # a device's own, with its token (PAST: past the token check, refused for what it asks: no round is open)
    ("GET", "/api/devices/kitchen"): (401, 200, 200),
    ("POST", "/api/rounds/1/updates"): (401, PAST, 401),
    ("POST", "/api/rounds/1/evaluations"): (401, PAST, 401),
    ("GET", "/api/rounds/1/relays/0"): (401, PAST, 401),
    ("POST", "/api/validation"): (401, PAST, 401),
    ("POST", "/api/tasks/t1/ack"): (401, PAST, 401),
    ("POST", "/api/tasks/t1/failure"): (401, PAST, 401),
}


def test_each_route_answers_no_token_a_device_token_and_the_admin_token_as_documented(fleet):
    app, kitchen = fleet
    add_device(app.extensions["fedspeech"].store, "hall")
    http = app.test_client()
    answers = {}
    for method, path in ROUTES:
        got = []
        for credential in (None, kitchen, ADMIN):
            headers = {"Authorization": f"Bearer {credential}"} if credential else {}
            # each from an address of its own: a device's token on the operator's routes counts as a wrong
            # admin token, and this test asks more often than an address may guess
            environ = {"REMOTE_ADDR": next(_addresses)}
            reply = http.open(path, method=method, headers=headers, data=b"{}", environ_base=environ)
            got.append(PAST if reply.status_code in (400, 409) else reply.status_code)
        answers[method, path] = tuple(got)
    assert answers == ROUTES
    registration = [_register(http, "kitchen", c).status_code for c in (None, ADMIN, kitchen)]
    assert registration == [401, 401, 200], "registering again takes the device's own token"


def test_status_names_devices_and_the_broker_only_to_the_admin(fleet):
    app, kitchen = fleet
    http = app.test_client()
    public = {"completed_round", "federated", "open_round", "target_rounds", "finished"}
    assert set(http.get("/api/status").get_json()) == public
    assert set(http.get("/api/status", headers={"Authorization": f"Bearer {kitchen}"}).get_json()) == public
    admin = http.get("/api/status", headers={"Authorization": f"Bearer {ADMIN}"}).get_json()
    assert set(admin) == public | {"devices_online", "broker", "device_errors", "waiting"}


def _same_answer(first, second, first_id: str, second_id: str) -> None:
    assert first.status_code == second.status_code
    assert first.get_json() == {
        k: v.replace(second_id, first_id) if isinstance(v, str) else v for k, v in second.get_json().items()
    }
    assert {**first.headers, "Content-Length": ""} == {**second.headers, "Content-Length": ""}  # ids' lengths


def test_enrolled_and_unknown_ids_get_the_same_answer_without_credentials(fleet):
    app, kitchen = fleet
    add_device(app.extensions["fedspeech"].store, "hall")  # enrolled, not registered yet
    http = app.test_client()
    for known in ("kitchen", "hall"):
        for credential in (None, "a-guess-at-a-token-or-secret-0123"):
            _same_answer(
                _register(http, known, credential), _register(http, "nobody", credential), known, "nobody"
            )
        for method in ("GET", "DELETE"):
            _same_answer(
                http.open(f"/api/devices/{known}", method=method),
                http.open("/api/devices/nobody", method=method),
                known,
                "nobody",
            )
    # nor does a device's token tell it which other ids are enrolled
    as_kitchen = {"Authorization": f"Bearer {kitchen}"}
    _same_answer(
        http.get("/api/devices/hall", headers=as_kitchen),
        http.get("/api/devices/nobody", headers=as_kitchen),
        "hall",
        "nobody",
    )
    assert (
        _register(http, "nobody").get_json()["error"].startswith("registration refused: device nobody is not")
    )


def test_a_revoked_device_is_told_so_only_with_its_own_old_token(tmp_path):
    app = _app(tmp_path, open_enrolment=True)
    store, http = app.extensions["fedspeech"].store, app.test_client()
    token = messages.decode(_register(http, "kitchen").data, Credentials).token
    assert revoke_device(store, "kitchen")

    for method, path in [("POST", "/api/rounds/1/updates"), ("GET", "/api/devices/kitchen")]:
        told = http.open(path, method=method, headers={"Authorization": f"Bearer {token}"})
        assert told.status_code == 401 and told.get_json()["revoked"] is True
        assert "kitchen was revoked" in told.get_json()["error"]
        guess = http.open(path, method=method, headers={"Authorization": "Bearer a-guess-0123456789abcdef"})
        assert guess.status_code == 401 and "revoked" not in guess.get_json()
    again = _register(http, "kitchen", token)
    assert again.status_code == 401 and again.get_json()["revoked"] is True, "not taken back as a new device"
    assert store.device("kitchen") is None

    assert http.get("/api/devices/kitchen", headers={"Authorization": f"Bearer {ADMIN}"}).status_code == 404
    secret = add_device(store, "kitchen")  # enrolled again: its new secret brings it back
    new_token = messages.decode(_register(http, "kitchen", secret).data, Credentials).token
    assert (
        http.get("/api/devices/kitchen", headers={"Authorization": f"Bearer {new_token}"}).status_code == 200
    )


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_wrong_admin_tokens_are_limited_per_address_and_the_right_one_is_not(fleet):
    app, _ = fleet
    clock = _Clock()
    app.extensions["fedspeech"].admin_guesses = GuessLimit(clock=clock)
    http = app.test_client()
    attacker, operator = {"REMOTE_ADDR": "192.0.2.66"}, {"REMOTE_ADDR": "192.0.2.10"}
    right = {"Authorization": f"Bearer {ADMIN}"}
    basic = base64.b64encode(b"anyone:wrong-guess").decode()

    for i in range(BURST):
        guess = {"Authorization": f"Bearer guess-{i:04d}-of-the-admin-token"}
        if i % 2:
            guess = {"Authorization": f"Basic {basic}"}
        assert http.get("/api/devices", headers=guess, environ_base=attacker).status_code == 401
    limited = http.get("/api/devices", headers={"Authorization": "Bearer one-more"}, environ_base=attacker)
    assert limited.status_code == 429 and 1 <= int(limited.headers["Retry-After"]) <= 6
    # the operator behind the same address (one NAT) is never locked out: the right token is let in
    for _ in range(3 * BURST):
        assert http.get("/api/devices", headers=right, environ_base=attacker).status_code == 200
        assert (
            http.get("/api/devices", headers={"Authorization": "Bearer x"}, environ_base=attacker).status_code
            == 429
        )
    status = http.get("/api/status", headers={"Authorization": "Bearer x"}, environ_base=attacker).get_json()
    assert "devices_online" not in status, "no route answers the limited address' guesses"
    # another address, and the right token, are not slowed
    for _ in range(3 * BURST):
        assert http.get("/api/devices", headers=right, environ_base=operator).status_code == 200
    assert http.get("/api/devices", headers=right).status_code == 200
    # a browser's first request, with no token, is no guess
    for _ in range(3 * BURST):
        assert http.get("/api/overview", environ_base=operator).status_code == 401

    clock.now += int(limited.headers["Retry-After"])
    assert (
        http.get("/api/devices", headers={"Authorization": "Bearer x"}, environ_base=attacker).status_code
        == 401
    )
    assert (
        http.get("/api/devices", headers={"Authorization": "Bearer y"}, environ_base=attacker).status_code
        == 429
    )


def test_the_guess_limit_remembers_a_bounded_number_of_addresses():
    clock = _Clock()
    limit = GuessLimit(burst=2, refill_s=5.0, max_addresses=100, clock=clock)
    for i in range(10_000):
        limit.failed(f"198.51.{i // 256}.{i % 256}")
    assert len(limit) == 100
    assert limit.retry_after("198.51.39.15") == 0  # the newest kept: one of its two tries left
    assert limit.failed("198.51.39.15"), "its last try"
    assert limit.retry_after("198.51.39.15") == 5
    clock.now += 2.5
    assert limit.retry_after("198.51.39.15") == 3
    clock.now += 2.5
    assert limit.retry_after("198.51.39.15") == 0
