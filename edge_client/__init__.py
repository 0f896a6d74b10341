"""Device daemon: registers with the coordinator, takes tasks over MQTT, trains locally and uploads."""

from fedspeech.edge_client.daemon import ClientConfig, run_client
from fedspeech.edge_client.profile import measure_profile, measure_rtt_ms

__all__ = ["ClientConfig", "measure_profile", "measure_rtt_ms", "run_client"]
