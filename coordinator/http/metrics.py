"""Prometheus metrics at `/metrics`, read from the stored rounds, the broker link and upload outcomes."""

from collections.abc import Iterator

from flask import Blueprint, Response, current_app
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from fedspeech.coordinator.broker.mqtt_link import CoordinatorLink
from fedspeech.coordinator.http.admin import refusal
from fedspeech.coordinator.round.upload_outcomes import UploadOutcomes
from fedspeech.coordinator.state.records import RoundRecord
from fedspeech.coordinator.state.store import Store

bp = Blueprint("metrics", __name__)
bp.before_request(refusal)

DURATION_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
# the names as Prometheus stores them, for dashboards and alerts (deploy/grafana-dashboard.json)
METRIC_NAMES = (
    "fedspeech_rounds_completed_total",
    "fedspeech_latest_round",
    "fedspeech_round_duration_seconds",
    "fedspeech_devices_online",
    "fedspeech_devices_registered",
    "fedspeech_updates_accepted_total",
    "fedspeech_updates_rejected_total",
    "fedspeech_bytes_total",
    "fedspeech_accuracy",
    "fedspeech_loss",
    "fedspeech_privacy_epsilon",
)


class FleetCollector(Collector):
    """Builds every metric at scrape time, so that they agree with the stored rounds, restarts included."""

    def __init__(self, store: Store, link: CoordinatorLink, outcomes: UploadOutcomes) -> None:
        self.store, self.link, self.outcomes = store, link, outcomes

    def collect(self) -> Iterator[Metric]:
        """The metrics now."""
        stored = self.store.rounds()
        trained = [r for r in stored if r.round > 0]  # round 0 is the initial model: nothing was trained
        yield CounterMetricFamily(
            "fedspeech_rounds_completed", "Training rounds completed and stored.", value=len(trained)
        )
        yield GaugeMetricFamily(
            "fedspeech_latest_round", "The latest stored round.", value=stored[-1].round if stored else -1
        )
        yield _durations(trained)
        registered = self.store.registered()
        online = GaugeMetricFamily("fedspeech_devices_online", "Registered devices online on the broker.")
        online.add_metric([], len(set(self.link.online()) & registered))
        yield online
        yield GaugeMetricFamily(
            "fedspeech_devices_registered", "Devices holding a token.", value=len(registered)
        )
        yield CounterMetricFamily(
            "fedspeech_updates_accepted",
            "Device updates that went into a stored round's model.",
            value=sum(r.results for r in trained),
        )
        rejected = CounterMetricFamily(
            "fedspeech_updates_rejected", "Uploads refused since the coordinator started.", labels=["reason"]
        )
        for reason, count in self.outcomes.rejected_counts().items():
            rejected.add_metric([reason], count)
        yield rejected
        moved = CounterMetricFamily(
            "fedspeech_bytes", "Model and update bytes moved in stored rounds.", labels=["direction"]
        )
        moved.add_metric(["up"], sum(r.bytes_up for r in trained))
        moved.add_metric(["down"], sum(r.bytes_down for r in trained))
        yield moved
        yield from _scores(stored)
        epsilon = GaugeMetricFamily(
            "fedspeech_privacy_epsilon",
            "Differential privacy spent by the latest round: epsilon at the delta labelled (none without).",
            labels=["delta"],
        )
        spent = [(r.dp_epsilon, r.dp_delta) for r in stored if r.dp_epsilon is not None]
        if spent:  # a fleet without differential privacy has no epsilon, not an epsilon of 0
            latest, delta = spent[-1]
            epsilon.add_metric([repr(delta)], latest)
        yield epsilon


def _durations(rounds: list[RoundRecord]) -> HistogramMetricFamily:
    """The histogram of the rounds' wall times."""
    buckets = [(str(bound), sum(r.wall_s <= bound for r in rounds)) for bound in DURATION_BUCKETS]
    return HistogramMetricFamily(
        "fedspeech_round_duration_seconds",
        "Wall time of each training round, from selection to the stored model.",
        buckets=[*buckets, ("+Inf", len(rounds))],
        sum_value=sum(r.wall_s for r in rounds),
    )


def _scores(rounds: list[RoundRecord]) -> Iterator[Metric]:
    """The latest accuracy and loss of each evaluation that has scored a model."""
    accuracy = GaugeMetricFamily(
        "fedspeech_accuracy", "The latest evaluated accuracy.", labels=["evaluation"]
    )
    loss = GaugeMetricFamily("fedspeech_loss", "The latest evaluated loss.", labels=["evaluation"])
    for evaluation, prefix in (("central", ""), ("federated", "federated_")):
        scored = [r for r in rounds if getattr(r, prefix + "accuracy") is not None]
        if scored:
            accuracy.add_metric([evaluation], getattr(scored[-1], prefix + "accuracy"))
            if (latest_loss := getattr(scored[-1], prefix + "loss")) is not None:
                loss.add_metric([evaluation], latest_loss)
    yield accuracy
    yield loss


@bp.get("/metrics")
def metrics() -> Response:
    """The metrics in Prometheus' text format."""
    service = current_app.extensions["fedspeech"]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetCollector(service.store, service.link, service.outcomes))
    return Response(generate_latest(registry), mimetype=CONTENT_TYPE_LATEST)
