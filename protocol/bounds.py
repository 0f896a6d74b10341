"""Bounds on the values of messages, the patterns of their ids and names, and the error for breaking them."""

import re

DEVICE_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}\Z")  # not "." or "..": it names a folder
NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}\Z")  # task names and labels: also safe as folder names
MAX_LABELS = 64
MAX_NEGATIVES, MAX_NEGATIVE_CHARS = 16, 100  # a task's negatives: paths inside a device's data folder
MAX_CONFIG = 16  # training settings a task may carry
MAX_COUNT = 10**9  # bound on any count a device reports
DECISION_BINS = 200  # a report's word decisions are counted by confidence in steps of 1 / DECISION_BINS
SAMPLE_RATES = (4_000, 48_000)
MIN_CLIP_SECONDS, MAX_CLIP_SECONDS = 0.1, 10.0
MAX_BLOB_BYTES = 64 * 1024 * 1024  # a model's weights or ONNX file, and a device's upload
# a safetensors blob's JSON header (names, shapes, offsets, metadata): a model's is a few KiB; parsing a
# header of tens of MB costs seconds of CPU, so a longer one is refused before it is parsed
MAX_WEIGHTS_HEADER_BYTES = 1024 * 1024
# what a task may ask of a device: an attacker's task must not keep it busy for ever
MAX_EPOCHS, MAX_BATCH_SIZE, MAX_LEARNING_RATE = 100, 1024, 10.0
MAX_TASK_SECONDS = 6 * 3600  # from the moment a device receives a task to its deadline
MAX_DEPTH = 64
TASK_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}\Z")
TOKEN = re.compile(r"^[A-Za-z0-9_-]{16,128}\Z")
SHA256 = re.compile(r"^[0-9a-f]{64}\Z")


class ProtocolError(ValueError):
    """A message that does not follow the contract; the text says why."""
