"""Every MLflow call with a deadline: a store that stops answering is given up for the process with one line."""

from __future__ import annotations

import os
import threading
from typing import Any

from suite.errors import RecordingError, SuiteError

#: The longest one MLflow call may take (seconds) before the store is given up: longer than MLflow's own bounded
#: HTTP retries (~35 s), so those answer first with their reason. SUITE_TRACKING_DEADLINE_S overrides it.
CALL_DEADLINE_S = 60.0
#: The same for calls that move artifact files (a run folder, a report), which may be slow on a slow network.
ARTIFACT_DEADLINE_S = 600.0


class TrackingStalled(RecordingError):
    """The tracking store did not answer a call in time (or an earlier one): given up for this process."""


def call_deadline_s() -> float:
    text = os.environ.get("SUITE_TRACKING_DEADLINE_S", "")
    try:
        value = float(text) if text else CALL_DEADLINE_S
    except ValueError:
        raise SuiteError(f"SUITE_TRACKING_DEADLINE_S must be a number of seconds, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise SuiteError(f"SUITE_TRACKING_DEADLINE_S must be a positive number of seconds, got {text!r}")
    return value


class Deadlined:
    """An ``MlflowClient`` whose every method runs in a daemon thread of its own and is abandoned after its deadline
    (``threading`` rather than a pool: a call that never returns must not hold a pool's worker, nor the interpreter's
    exit). A missed deadline, or MLflow's own HTTP read timeouts, give the store up: every later call raises
    :class:`TrackingStalled` at once with the first reason, instead of waiting again."""

    def __init__(self, client: Any, uri: str) -> None:
        self._client, self._uri = client, uri
        self._deadline_s = call_deadline_s()
        self._given_up: str | None = None

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._client, name)
        if not callable(method):
            return method

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._call(name, method, args, kwargs)

        return call

    def _call(self, name: str, method: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self._given_up is not None:
            raise TrackingStalled(self._given_up)
        outcome: dict[str, Any] = {}
        finished = threading.Event()

        def target() -> None:
            try:
                outcome["value"] = method(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread below
                outcome["error"] = exc
            finally:
                finished.set()

        threading.Thread(target=target, name=f"mlflow-{name}", daemon=True).start()
        deadline = ARTIFACT_DEADLINE_S if "artifact" in name else self._deadline_s
        if not finished.wait(deadline):
            self._given_up = (f"the MLflow tracking store {self._uri} did not answer {name} within {deadline:g} s "
                              "(stopped, hung or overloaded); nothing more is sent to it from this process")
            raise TrackingStalled(self._given_up)
        error = outcome.get("error")
        if error is None:
            return outcome["value"]
        if "Read timed out" in str(error):  # MLflow's bounded HTTP retries, every one timed out
            timeout = os.environ.get("MLFLOW_HTTP_REQUEST_TIMEOUT", "120")
            tries = int(os.environ.get("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "7")) + 1
            self._given_up = (f"the MLflow tracking server {self._uri} accepted {name} but did not answer within "
                              f"{timeout} s, {tries} times (stopped, hung or overloaded); nothing more is sent to it "
                              "from this process")
            raise TrackingStalled(self._given_up) from None
        raise error
