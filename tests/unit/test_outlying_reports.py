"""A device's evaluation report far from the others' is flagged for the operator, never hidden."""

import time

import numpy as np
import pytest

from fedspeech.coordinator.http.overview import ReportView, last_reports
from fedspeech.coordinator.round.evaluation import outlying
from fedspeech.coordinator.round.new_model import RoundTally, store_round
from fedspeech.coordinator.state.records import DeviceEvaluation
from fedspeech.coordinator.state.store import Store
from tests.helpers.fake_fleet import FakeModel


def test_a_report_far_from_the_others_is_flagged_with_their_median():
    honest = {"a": 0.31, "b": 0.28, "c": 0.35, "d": 0.30}
    assert outlying(honest) == {}, "the spread of honest speakers is not flagged"
    assert outlying({**honest, "liar": 1.0}) == {"liar": pytest.approx(0.305)}
    assert outlying({**honest, "far": 0.05}) == {"far": pytest.approx(0.305)}, "far below, too"
    assert outlying({"a": 0.3, "liar": 1.0}) == {}, "two reports: neither can be told from the other"
    spread = {"a": 0.2, "b": 0.5, "c": 0.8, "d": 0.35, "e": 0.65}
    assert outlying(spread) == {}, "within three median deviations of a spread-out fleet"


def test_the_overview_shows_each_devices_last_report_and_flags_the_far_one(tmp_path):
    store = Store(tmp_path / "state")
    for round in (1, 2):
        store_round(store, FakeModel(), round, {"w": np.zeros(2, np.float32)}, RoundTally(time.time()), None)
    assert last_reports(store, store.rounds()) == {}, "nothing evaluated yet"
    reports = [DeviceEvaluation(d, 50, correct, 10.0) for d, correct in [("a", 15), ("b", 16), ("c", 14)]]
    store.save_evaluation(2, 4, (0.3, 0.3, 1.0), [*reports, DeviceEvaluation("liar", 50, 50, 0.0)])
    shown = last_reports(store, store.rounds())
    assert shown["a"] == ReportView(2, 0.3, 50, None)
    assert shown["liar"] == ReportView(2, 1.0, 50, pytest.approx(0.3))
