"""Secret files that other users can read are named in one warning with the `chmod 600` that fixes them."""

import logging
import re

import pytest

from fedspeech.connection_options import read_secret
from fedspeech.edge_client.credentials import TOKEN_FILE, DeviceCredentials, issued_login
from fedspeech.protocol.mqtt import BrokerSettings

LOGGER = "fedspeech.protocol.files"


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


@pytest.mark.parametrize(("mode", "warned"), [(0o644, True), (0o640, True), (0o604, True), (0o600, False)])
def test_an_enrolment_secret_others_can_read_is_warned_about(tmp_path, caplog, mode, warned):
    secret = tmp_path / "kitchen-pi.secret"
    secret.write_text("the-secret\n")
    secret.chmod(mode)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert read_secret(secret, "enrolment secret", "client") == "the-secret", "it is still used"
    expected = (
        f"the enrolment secret {secret} is readable by other users (mode {mode:03o}): make it private with "
        f"`chmod 600 {secret}`"
    )
    assert _warnings(caplog) == ([expected] if warned else [])


def test_a_device_token_and_issued_password_others_can_read_are_warned_about(tmp_path, caplog):
    folder = tmp_path / "kitchen-pi"
    folder.mkdir()
    (folder / TOKEN_FILE).write_text("a" * 43 + "\n")
    (folder / TOKEN_FILE).chmod(0o644)
    password = folder / "broker-password"
    password.write_text("issued\n")
    password.chmod(0o644)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        DeviceCredentials(folder)
        issued_login(BrokerSettings(), "kitchen-pi", password)
    said = _warnings(caplog)
    assert len(said) == 2, said
    assert f"chmod 600 {folder / TOKEN_FILE}" in said[0] and f"chmod 600 {password}" in said[1]


@pytest.mark.parametrize(
    ("content", "wrong"),
    [(b"", "is empty"), (b"\n\n", "is empty"), (b"  \n", "is empty"), (b"\xff\xfe", "is not text")],
)
def test_an_empty_secret_file_is_named_with_what_to_put_in_it(tmp_path, content, wrong):
    secret = tmp_path / "kitchen-pi.secret"
    secret.write_bytes(content)
    secret.chmod(0o600)
    expected = (
        f"fedspeech client: the enrolment secret file {secret} {wrong}: put the enrolment secret on its "
        "first line, the one `fedspeech devices add` printed or wrote to --secret-file"
    )
    with pytest.raises(SystemExit, match=f"^{re.escape(expected)}$"):
        read_secret(secret, "enrolment secret", "client")
