"""A growing transformer trained by real device processes: each round sends and exports its current depth."""

import onnx
import pytest

from fedspeech.export.onnx_export import PREFIX
from fedspeech.models import depth_of
from fedspeech.protocol import weights
from tests.helpers.coordinators import running_coordinator, wait_until_finished
from tests.helpers.devices import start_clients
from tests.helpers.ports import free_port


def _onnx_depth(data: bytes) -> int:
    """Encoder blocks in the graph's weights, checked against the depth its metadata states."""
    proto = onnx.load_from_string(data)
    depth = depth_of(init.name.removeprefix(PREFIX) for init in proto.graph.initializer)
    assert {p.key: p.value for p in proto.metadata_props}["depth"] == str(depth)
    return depth


@pytest.mark.parametrize("strategy", ["fedavg", "hardware"])
def test_growing_run_trains_sends_and_exports_only_the_current_depth(
    strategy, tmp_path, topic_root, processes
) -> None:
    speakers = ["jackson", "nicolas"]
    config = {
        "strategy": strategy,
        "k": 2,
        "broker_port": free_port(),
        "topic_root": topic_root,
        "model": "transformer",
        "depth": 2,
        "depth_schedule": "linear",
        "rounds": 4,
        "epochs": 1,
        "min_devices": 2,
        "min_results": 2,
    }
    with running_coordinator(tmp_path, **config) as (service, url):
        clients = start_clients(processes, speakers, url, service.broker_url, topic_root, max_samples=24)
        wait_until_finished(service, clients)
        store = service.store
        rounds = store.rounds()
        # round r's stored model is what round r + 1 trains: depth 1 for rounds 1-2, then 2
        stored = [weights.decode(store.model_path(r.round, "weights").read_bytes())[0] for r in rounds]
        depths = [depth_of(arrays) for arrays in stored]
        assert depths == [1, 1, 2, 2, 2]
        assert [_onnx_depth(store.model_path(r.round, "onnx").read_bytes()) for r in rounds] == depths
        for r in rounds[1:]:
            size = store.model_path(r.round - 1, "weights").stat().st_size  # the model the round trains from
            assert r.bytes_down == 2 * size, "each device downloads the model at the round's depth"
            assert 2 * size * 0.95 < r.bytes_up < 2 * size * 1.05
        assert rounds[-1].accuracy is not None
