"""`fedspeech status`'s tables, rendered from an overview as the coordinator's API gives it."""

from fedspeech.status import render


def _device(device_id: str, missing: list[str] | None) -> dict:
    return {
        "device_id": device_id, "state": "online", "online": True, "registered": True, "score": 0.5,
        "num_samples": 40, "last_seen": 99.0, "rounds_joined": 2, "last_update": None, "last_error": None,
        "missing_labels": missing,
    }  # fmt: skip


def _overview(devices: list[dict], first_model: str | None) -> dict:
    model = {"round": 2, "architecture": "cnn", "weights_bytes": 4000, "onnx_bytes": 0, "onnx_url": None}
    return {
        "at": 100.0, "task": "fsdd", "strategy": "fedavg", "completed_round": 2, "target_rounds": 5,
        "finished": False, "open_round": None, "waiting": None, "devices_online": len(devices),
        "devices": devices, "rounds": [], "model": model, "first_model": first_model,
    }  # fmt: skip


def test_each_device_row_names_the_labels_it_has_no_clip_of():
    devices = [
        _device("kitchen", ["3", "4", "5", "6", "7"]),
        _device("hall", []),
        _device("porch", None),
    ]
    lines = render(_overview(devices, "random weights"), "http://c", 5).splitlines()
    header = next(line for line in lines if line.startswith("DEVICE"))
    assert "MISSING" in header.split()
    column = header.index("MISSING")
    cells = {
        line.split()[0]: line[column:].split()[0]
        for line in lines
        if line.split()[:1] in (["kitchen"], ["hall"], ["porch"])
    }
    assert cells == {"kitchen": "3,4,5", "hall": "none", "porch": "-"}
    assert next(line for line in lines if line.startswith("kitchen")).split()[5] == "+2"
    assert "first model (round 0): random weights" in lines


def test_a_first_model_not_recorded_is_left_unsaid():
    lines = render(_overview([_device("hall", [])], None), "http://c", 5).splitlines()
    assert not any(line.startswith("first model") for line in lines)
