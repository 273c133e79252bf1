"""coordinator/core/admission.py: the Hello token bucket, and no Hello while the loop lags."""

from __future__ import annotations

import pytest

from coordinator.core.admission import DEGRADED_RETRY_S, AdmissionError, HelloAdmission


def test_a_burst_is_admitted_then_the_rest_is_spread_at_the_rate() -> None:
    bucket = HelloAdmission(rate_per_s=10.0, burst=3)
    assert [bucket.admit(0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    delays = [bucket.admit(0.0) for _ in range(3)]
    assert delays == pytest.approx([0.1, 0.2, 0.3])  # one token apart: they return spread
    assert bucket.admit(1.0) == 0.0  # refilled


def test_no_hello_is_admitted_while_the_loop_lags_past_the_degraded_bound() -> None:
    bucket = HelloAdmission(rate_per_s=100.0, burst=100, degraded_after_lag_s=0.5)
    assert bucket.admit(0.0, lag_s=0.49) == 0.0
    first = bucket.admit(0.0, lag_s=0.5)  # tokens left, but the loop is late
    assert first == pytest.approx(DEGRADED_RETRY_S)
    second = bucket.admit(0.0, lag_s=0.8)
    assert second == pytest.approx(max(DEGRADED_RETRY_S, 1.6))  # twice the lag
    third = bucket.admit(0.0, lag_s=0.8)
    assert third == pytest.approx(second + 0.01)  # deferred ones come back spread
    assert bucket.admit(5.0, lag_s=0.1) == 0.0  # the lag cleared: admitted again


def test_without_a_bound_lag_does_not_matter() -> None:
    bucket = HelloAdmission(rate_per_s=1.0, burst=1)
    assert bucket.admit(0.0, lag_s=60.0) == 0.0


def test_settings_out_of_range_are_refused() -> None:
    with pytest.raises(AdmissionError):
        HelloAdmission(rate_per_s=1.0, burst=1, degraded_after_lag_s=0.0)


def test_no_hello_is_admitted_while_the_process_is_saturated() -> None:
    bucket = HelloAdmission(rate_per_s=100.0, burst=100, defer_above_cpu=0.85)
    assert bucket.admit(0.0, cpu=0.84) == 0.0
    assert bucket.admit(0.0, cpu=0.85) == pytest.approx(DEGRADED_RETRY_S)
    assert bucket.admit(2.0, cpu=0.3) == 0.0  # load fell: admitted again
