"""Every route of a live coordinator against its own OpenAPI document, with schemathesis: generated paths,
headers and bodies get no server error and only the replies the document describes.
"""

import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import (
    FailureGroup,
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from fedspeech.protocol import messages, routes
from fedspeech.protocol.messages import Credentials, Profile, Registration
from tests.helpers.ports import free_port
from tests.helpers.waiting import get_json, wait_for

CASES_PER_OPERATION = 25
ADMIN_TOKEN = "schema-test-admin-token-0123456789"
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


def _register(url: str, device_id: str) -> str:
    body = messages.encode(Registration(device_id, 40, Profile(1, 0.0, 256.0)))
    request = urllib.request.Request(url + routes.DEVICES, data=body, method="POST")
    with urllib.request.urlopen(request, timeout=10) as reply:
        return messages.decode(reply.read(), Credentials).token


def _token(security: list[dict[str, list[str]]], device_token: str) -> str | None:
    """The token an operation is called with: the admin's wherever it is taken, else a device's, else none.

    The admin's where either is: a device's token on an admin route counts as a wrong admin token, and
    the coordinator answers an address past a few of those with 429 only.
    """
    schemes = {name for requirement in security for name in requirement}
    if "adminToken" in schemes:
        return ADMIN_TOKEN
    return device_token if "deviceToken" in schemes else None


def _run(
    operation: schemathesis.APIOperation, url: str, session: requests.Session, headers: dict[str, str]
) -> tuple[int, int, list[str]]:
    """Call one operation with its generated cases, valid and not: how many, how many got a 5xx, and
    what failed the checks.
    """
    ran, server_errors, failures = 0, 0, []

    @settings(
        max_examples=CASES_PER_OPERATION,
        deadline=None,
        database=None,
        phases=[Phase.generate],  # every failure is collected, none shrunk: the run stays bounded
        suppress_health_check=list(HealthCheck),
    )
    @given(
        case=st.one_of(
            operation.as_strategy(GenerationMode.POSITIVE), operation.as_strategy(GenerationMode.NEGATIVE)
        )
    )
    def check(case: schemathesis.Case) -> None:
        nonlocal ran, server_errors
        response = case.call(base_url=url, session=session, headers=headers, timeout=10)
        ran, server_errors = ran + 1, server_errors + (response.status_code >= 500)
        try:
            case.validate_response(response, checks=CHECKS)
        except (AssertionError, FailureGroup) as failure:
            failures.append(f"{operation.label}: {failure}")

    check()
    return ran, server_errors, failures


@pytest.mark.timeout(300)  # a bound on a run of about 35 s: the cases are counted, not timed
def test_every_route_keeps_to_the_document(
    tmp_path: Path, mosquitto_url, topic_root, processes, record_property
) -> None:
    token_file = tmp_path / "admin-token"
    token_file.write_text(ADMIN_TOKEN)
    token_file.chmod(0o600)
    port = free_port()
    proc = processes.start(
        "coordinator",
        "coordinator",
        "--state", str(tmp_path / "state"), "--new-state",
        "--broker", mosquitto_url,
        "--port", str(port),
        "--topic-root", topic_root,
        "--open-enrolment",
        "--admin-token-file", str(token_file),
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: get_json(url + routes.STATUS) or proc.poll() is not None, 90, "the coordinator to serve")
    assert proc.poll() is None, proc.log_path.read_text()[-2000:]
    device_token = _register(url, "schema-probe")

    schema = schemathesis.openapi.from_url(url + routes.PREFIX + routes.OPENAPI_RULE)
    operations = [result.ok() for result in schema.get_all_operations()]
    cases: Counter[str] = Counter()
    failures: list[str] = []
    server_errors = 0
    session = requests.Session()  # one connection: the coordinator caps those of one address
    started = time.monotonic()

    for operation in operations:
        token = _token(operation.definition.raw.get("security", []), device_token)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        cases[operation.label], errors, failed = _run(operation, url, session, headers)
        server_errors, failures = server_errors + errors, failures + failed

    seconds = time.monotonic() - started
    figures = (
        f"schemathesis: {len(operations)} operations, {sum(cases.values())} cases in {seconds:.1f} s, "
        f"{server_errors} server errors, {len(failures)} responses off the document; cases: {dict(cases)}"
    )
    print(figures)
    record_property("figures", figures)
    assert not failures, f"{len(failures)} failures:\n\n" + "\n\n".join(failures[:10])
    documented = {
        f"{method.upper()} {path}" for path, item in schema.raw_schema["paths"].items() for method in item
    }
    # schemathesis leaves out the document's own URL, which it has read
    assert set(cases) == documented - {f"GET {routes.PREFIX}{routes.OPENAPI_RULE}"}, cases
    assert proc.poll() is None, "the coordinator stopped"
