"""The device: learns the task, trains and evaluates on its own clips, records them, runs the global model."""

from fedspeech.edge_client.daemon import ClientConfig, run_client
from fedspeech.edge_client.local_data import DataSource
from fedspeech.edge_client.profile import measure_profile, measure_rtt_ms

__all__ = ["ClientConfig", "DataSource", "measure_profile", "measure_rtt_ms", "run_client"]
