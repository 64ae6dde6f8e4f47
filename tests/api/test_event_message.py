"""Event messages cut to the API server's 1024-byte limit, start and end kept."""

from __future__ import annotations

from rlkube_api.event_message import EVENT_MESSAGE_LIMIT, fit_event_message


def test_a_message_that_fits_is_unchanged() -> None:
    message = "x" * EVENT_MESSAGE_LIMIT
    assert fit_event_message(message) is message


def test_a_long_message_keeps_its_start_and_its_end_within_the_limit() -> None:
    message = "pod job-actor-0 (role actor) failed: " + "log line\n" * 500 + "ValueError: the real error"
    fitted = fit_event_message(message)
    assert len(fitted.encode()) <= EVENT_MESSAGE_LIMIT
    assert fitted.startswith("pod job-actor-0 (role actor) failed: ")
    assert fitted.endswith("ValueError: the real error")
    assert " … " in fitted


def test_multibyte_characters_are_counted_as_bytes_and_never_split() -> None:
    message = "é" * 2000  # 4000 bytes
    fitted = fit_event_message(message)
    assert len(fitted.encode()) <= EVENT_MESSAGE_LIMIT
    assert set(fitted.replace(" … ", "")) == {"é"}
