"""Signed control messages: the coordinator signs every task and model announcement it publishes (Ed25519).

Anyone who can publish on the broker could otherwise hand devices work or listeners a model. A signed
payload is a small JSON envelope around the message's exact bytes. The signature covers the topic as well
as the message, so a genuine task for one device cannot be replayed onto another device's topic.
"""

import base64
import binascii
import json
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from fedspeech.protocol.bounds import ProtocolError
from fedspeech.protocol.files import write_atomically
from fedspeech.protocol.messages import MAX_MESSAGE_BYTES


class BadSignature(ProtocolError):
    """A well-formed signed message that the given key did not sign for this topic."""


MAX_SIGNED_BYTES = MAX_MESSAGE_BYTES * 4 // 3 + 256  # a message in base64, its signature and the envelope
_KIND = "signed"


def _signed_bytes(topic: str, body: bytes) -> bytes:
    return topic.encode() + b"\0" + body


def sign(key: Ed25519PrivateKey, topic: str, body: bytes) -> bytes:
    """The payload to publish on topic: body and its signature over topic and body."""
    signature = key.sign(_signed_bytes(topic, body))
    envelope = {
        "kind": _KIND,
        "body": base64.b64encode(body).decode(),
        "signature": base64.b64encode(signature).decode(),
    }
    return json.dumps(envelope, separators=(",", ":")).encode()


def verify(key: Ed25519PublicKey, topic: str, payload: bytes | bytearray) -> bytes:
    """The message bytes of a payload received on topic; ProtocolError if unsigned or badly signed."""
    if len(payload) > MAX_SIGNED_BYTES:
        raise ProtocolError(f"signed payload of {len(payload)} bytes exceeds {MAX_SIGNED_BYTES}")
    try:
        envelope = json.loads(payload)
    except (ValueError, RecursionError):
        raise ProtocolError("not a signed message: not JSON") from None
    if not isinstance(envelope, dict) or envelope.get("kind") != _KIND:
        raise ProtocolError("not a signed message")
    body, signature = envelope.get("body"), envelope.get("signature")
    if not isinstance(body, str) or not isinstance(signature, str):
        raise ProtocolError("signed message without body or signature")
    try:
        body_bytes = base64.b64decode(body, validate=True)
        signature_bytes = base64.b64decode(signature, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError("signed message with bad base64") from None
    try:
        key.verify(signature_bytes, _signed_bytes(topic, body_bytes))
    except UnicodeEncodeError:
        raise ProtocolError("the topic is not UTF-8 text") from None
    except InvalidSignature:
        raise BadSignature("bad signature: not signed by the coordinator's key for this topic") from None
    return body_bytes


def public_key_text(key: Ed25519PrivateKey | Ed25519PublicKey) -> str:
    """A public key as devices pin it: its 32 raw bytes in base64."""
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode()


def parse_public_key(text: str) -> Ed25519PublicKey:
    """The public key of public_key_text's form; ProtocolError if it is not one."""
    try:
        raw = base64.b64decode(text.strip(), validate=True)
        return Ed25519PublicKey.from_public_bytes(raw)
    except (binascii.Error, ValueError):
        raise ProtocolError(f"not an Ed25519 public key in base64: {text[:60]!r}") from None


def load_public_key(text_or_path: str) -> Ed25519PublicKey:
    """A pinned key given as base64 text or as the path of a file holding it; ProtocolError if neither."""
    path = Path(text_or_path)
    if len(text_or_path) < 256 and path.is_file():
        if path.stat().st_size > 1024:
            raise ProtocolError(f"{path}: too large for a public key")
        text_or_path = path.read_text(errors="replace")
    return parse_public_key(text_or_path)


def load_or_create_key(path: Path) -> Ed25519PrivateKey:
    """The signing key kept at path (PEM, mode 0600), made on first use; ValueError for a damaged file."""
    path = Path(path)
    if path.exists():
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise ValueError(f"{path} does not hold an Ed25519 private key")
        return key
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    write_atomically(path, pem, private=True)
    return key
