"""The fleet's Mosquitto, as the coordinator's state describes it: its users, their passwords and its files.

`fedspeech broker-config` writes STATE/broker/: mosquitto.conf (no anonymous clients, each client's id its
user name, packets bounded), acl (a device reads only its own task and the model and writes only its own
status; a listener writes only its own detections, availability and Home Assistant discovery config;
Home Assistant reads those and nothing else but the model announcement), passwd (Mosquitto's own format)
and the plain passwords Mosquitto never reads: the coordinator's (coordinator.password), Home Assistant's
(homeassistant.password) and each device's and its listener's (devices/). Enrolling or revoking a device
then adds or removes its users and rewrites passwd; Mosquitto reads it again on SIGHUP. A device learns
its passwords when it registers (they go to it with its token over the coordinator's HTTP API), so only
an enrolled device, or one it gave its credentials, can log in.
"""

import base64
import fcntl
import hashlib
import logging
import pwd
import re
import secrets
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from fedspeech.protocol.bounds import DEVICE_ID, TOKEN
from fedspeech.protocol.files import write_atomically
from fedspeech.protocol.topics import (
    COORDINATOR_USER,
    DEFAULT_DISCOVERY_PREFIX,
    HOME_ASSISTANT_USER,
    Topics,
    event_discovery,
    listen_user,
    shares_a_user,
)

log = logging.getLogger(__name__)

FOLDER = "broker"  # in the coordinator's state directory
MAX_PACKET_BYTES = 100_000  # a signed task or announcement (at most 87,637 bytes) and its topic
# Mosquitto's PBKDF2-SHA512 ($7$), with mosquitto_passwd's salt size and iterations: the passwords are
# random 256-bit tokens, so more iterations would slow every login and guard nothing.
HASH_ITERATIONS, SALT_BYTES = 101, 12
TOPIC_ROOT = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*\Z")  # no wildcard, space or line break


@dataclass(frozen=True)
class DeviceLogins:
    """A device's broker passwords: its own (user: its id) and its listener's (user: <id>-listen)."""

    password: str
    listen_password: str


def mosquitto_hash(password: str, salt: bytes | None = None) -> str:
    """password as a password_file entry's hash ($7$: PBKDF2-SHA512), as mosquitto_passwd writes it."""
    salt = secrets.token_bytes(SALT_BYTES) if salt is None else salt
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, HASH_ITERATIONS)
    return f"$7${HASH_ITERATIONS}${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


def config_text(folder: Path, host: str, port: int, user: str | None = None) -> str:
    """mosquitto.conf for the files in folder (an absolute path), listening on host:port, run as user
    when started as root (None: Mosquitto's own user).
    """
    run_as = (
        "# Started as root, Mosquitto becomes this user, who owns this folder and may read it (mode 0700)\n"
        f"user {user}\n"
        if user is not None
        else ""
    )
    return f"""# Written by `fedspeech broker-config`: run it again rather than edit this file.
# Every client logs in with its own user and password (passwd) and may touch only its own topics (acl).
{run_as}allow_anonymous false
password_file {folder / "passwd"}
acl_file {folder / "acl"}
# a bigger packet disconnects its sender; model weights go over HTTP, never over MQTT
max_packet_size {MAX_PACKET_BYTES}
pid_file {folder / "mosquitto.pid"}
log_dest file {folder / "mosquitto.log"}
log_dest stderr

listener {port} {host}
# A client's id is its user name, whatever id it asks for: nobody can take another client's id, which
# would disconnect that client and publish its last will ("offline") in its name.
use_username_as_clientid true
"""


def acl_text(topics: Topics, discovery_prefix: str = DEFAULT_DISCOVERY_PREFIX) -> str:
    """The ACL: every user reads the model; a device writes its own status and reads its own task; a
    listener writes its own detections, availability and discovery config; Home Assistant reads them.
    """
    return f"""# Written by `fedspeech broker-config`. %u is the user's name, a device's id. Anything not
# allowed here is refused: a forbidden publish is dropped, a forbidden subscription receives nothing.
# Mosquitto warns at start that the first pattern has no %u: it is meant so, every user reads the model.
pattern read {topics.model}
pattern write {topics.status("%u")}
pattern read {topics.task("%u")}
# `fedspeech listen --publish`, as <device id>-listen: its detections, its availability (its last will)
# and its Home Assistant discovery config, each named by its own user. No device's id ends in -listen.
pattern write {topics.detections("%u")}
pattern write {topics.availability("%u")}
pattern write {event_discovery(discovery_prefix, "%u")}

user {COORDINATOR_USER}
topic read {topics.all_status}
topic write {topics.task("+")}
topic write {topics.model}

# Home Assistant's MQTT integration: the listeners' events and discovery configs; its own status
user {HOME_ASSISTANT_USER}
topic read {topics.all_listeners}
topic read {discovery_prefix}/#
topic write {discovery_prefix}/status
"""


def configured(state_dir: Path) -> bool:
    """Whether `fedspeech broker-config` has written the broker's files in this state."""
    return (Path(state_dir) / FOLDER / "mosquitto.conf").is_file()


def reload_hint(state_dir: Path) -> str:
    """The command that makes a running Mosquitto read its password file again."""
    return f"kill -HUP $(cat {Path(state_dir).resolve() / FOLDER / 'mosquitto.pid'})"


def coordinator_password_file(state_dir: Path) -> Path | None:
    """The coordinator's own broker password file, if `fedspeech broker-config` made one."""
    path = Path(state_dir) / FOLDER / f"{COORDINATOR_USER}.password"
    return path if path.is_file() else None


def home_assistant_password_file(state_dir: Path) -> Path | None:
    """The password file of the broker's Home Assistant user, if `fedspeech broker-config` made one."""
    path = Path(state_dir) / FOLDER / f"{HOME_ASSISTANT_USER}.password"
    return path if path.is_file() else None


def check_topic_root(topic_root: str, option: str = "--topic-root") -> None:
    """ValueError for a topic root (or prefix) that an ACL line cannot name (a wildcard, a space, a line
    break).
    """
    if not TOPIC_ROOT.match(topic_root):
        raise ValueError(
            f"{option} {topic_root!r}: use ASCII letters, digits, '_', '.' and '-', with '/' between levels"
        )


def write_config(
    state_dir: Path,
    host: str,
    port: int,
    topic_root: str,
    device_ids: Iterable[str],
    discovery_prefix: str = DEFAULT_DISCOVERY_PREFIX,
) -> Path:
    """Write the broker's files for these devices (passwords kept, new ones made); the config's path.

    Users of devices not among device_ids are removed. ValueError for a topic root or Home Assistant
    discovery prefix an ACL cannot name.
    """
    check_topic_root(topic_root)
    check_topic_root(discovery_prefix, "--discovery-prefix")
    folder = Path(state_dir).resolve() / FOLDER
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    with _locked(folder):
        _password(folder / f"{COORDINATOR_USER}.password")
        _password(folder / f"{HOME_ASSISTANT_USER}.password")
        wanted = {device_id for device_id in device_ids if not shares_a_user(device_id)}
        users = {user for device_id in wanted for user in _users(device_id)}
        for path in _device_folder(folder).glob("*.password"):
            if path.stem not in users:
                path.unlink()
        for device_id in sorted(wanted):
            _device_passwords(folder, device_id)
        write_atomically(folder / "acl", acl_text(Topics(topic_root), discovery_prefix).encode())
        _write_password_file(folder)
        config = config_text(folder, host, port, folder_owner(folder))
        write_atomically(folder / "mosquitto.conf", config.encode())
    return folder / "mosquitto.conf"


def folder_owner(folder: Path) -> str | None:
    """The name of the user who owns folder; None if the system has no name for its id (a container's)."""
    try:
        return pwd.getpwuid(folder.stat().st_uid).pw_name
    except KeyError:
        return None


def device_logins(state_dir: Path, device_id: str) -> DeviceLogins | None:
    """The device's broker passwords, made if new; None without a broker config, or for a reserved id."""
    folder = Path(state_dir) / FOLDER
    if not configured(state_dir) or shares_a_user(device_id):
        return None
    with _locked(folder):
        logins, made = _device_passwords(folder, device_id)
        if made:
            _write_password_file(folder)
            log.warning(
                "made broker users for %s: reload Mosquitto (%s) before it can log in",
                device_id,
                reload_hint(state_dir),
            )
    return logins


def remove_device(state_dir: Path, device_id: str) -> bool:
    """Remove the device's broker users; True if the password file changed (Mosquitto must reload)."""
    folder = Path(state_dir) / FOLDER
    if not configured(state_dir) or shares_a_user(device_id):
        return False
    with _locked(folder):
        paths = [_device_folder(folder) / f"{user}.password" for user in _users(device_id)]
        existed = [path for path in paths if path.exists()]
        for path in existed:
            path.unlink()
        if existed:
            _write_password_file(folder)
    return bool(existed)


def _users(device_id: str) -> tuple[str, str]:
    """The device's user and its listener's; ValueError for an id that is not a device's (a path, say)."""
    if not DEVICE_ID.match(device_id) or shares_a_user(device_id):
        raise ValueError(f"no broker users for the device id {device_id[:64]!r}")
    return device_id, listen_user(device_id)


def _device_folder(folder: Path) -> Path:
    devices = folder / "devices"
    devices.mkdir(mode=0o700, exist_ok=True)
    return devices


def _device_passwords(folder: Path, device_id: str) -> tuple[DeviceLogins, bool]:
    """The passwords of the device's users, and whether any was made now."""
    devices = _device_folder(folder)
    (password, made), (listen_password, listen_made) = (
        _password(devices / f"{user}.password") for user in _users(device_id)
    )
    return DeviceLogins(password, listen_password), made or listen_made


def _password(path: Path) -> tuple[str, bool]:
    """The password kept in path, made (random, 256 bits) if there is none or it is damaged; whether made."""
    if path.is_file() and TOKEN.match(kept := path.read_text().strip()):
        return kept, False
    password = secrets.token_urlsafe(32)
    write_atomically(path, f"{password}\n".encode(), private=True)
    return password, True


def _write_password_file(folder: Path) -> None:
    """passwd: the coordinator, Home Assistant and every device user that has a password, each with a fresh
    salt.
    """
    own = [folder / f"{user}.password" for user in (COORDINATOR_USER, HOME_ASSISTANT_USER)]
    files = [path for path in own if path.is_file()] + sorted(_device_folder(folder).glob("*.password"))
    lines = [f"{path.stem}:{mosquitto_hash(path.read_text().strip())}\n" for path in files]
    write_atomically(folder / "passwd", "".join(lines).encode(), private=True)


@contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """One writer at a time across processes: the coordinator and `fedspeech devices` share the folder."""
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
