"""Asking whether devices are here without claiming them: the probe runs in a short-lived process.

Asking CUDA for a card's name creates a CUDA context, and importing Habana's bridge opens the card: a long-lived parent
(``suite run``, the device check) that asked in its own process would hold the device while its configuration
processes start, and on an exclusive-process GPU or a one-card Gaudi host they could not get it. So the question is
asked by ``python -m suite.devices.probe NAME...``, which answers in JSON and exits, releasing whatever it opened.
Adapters whose question touches nothing (:attr:`~suite.devices.base.DeviceTraits.probe_claims_device` False: the
CPU) are asked here. :func:`probe` is what ``suite devices``, ``suite run`` (which refuses an unavailable device
before it creates anything) and ``scripts/device-check.sh`` ask.

With ``--precisions`` the probe also sets the device up and says which precisions it runs (``supported_precisions``
in the details), for the device check's plan.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from typing import Any, Sequence

from suite.devices.base import Availability
from suite.registry import load_device

#: How long a probe may take: importing torch and a vendor stack on a cold disk takes tens of seconds.
PROBE_TIMEOUT_S = 180.0


def _ask(name: str, precisions: bool) -> dict[str, Any]:
    """One device's answer, in this process (never raises)."""
    try:
        cls = load_device(name)
        availability = cls.availability()
    except Exception as exc:  # noqa: BLE001 - an adapter that cannot even be asked is unavailable, with the reason
        return {"available": False, "reason": f"{type(exc).__name__}: {' '.join(str(exc).split())}", "details": {}}
    answer: dict[str, Any] = {"available": availability.available, "reason": availability.reason,
                              "details": dict(availability.details)}
    if precisions and availability.available:
        try:
            adapter = cls()
            adapter.setup()
            answer["details"]["supported_precisions"] = list(adapter.numerics().supported())
            adapter.teardown()
        except Exception as exc:  # noqa: BLE001 - said, not raised: the device is there but cannot be set up
            answer.update(available=False, reason=f"set-up failed: {type(exc).__name__}: "
                                                  f"{' '.join(str(exc).split())}")
    return answer


def probe(names: Sequence[str], precisions: bool = False) -> dict[str, Availability]:
    """Each device's availability, asked without claiming it in this process (see the module's docstring).
    Unknown names raise :class:`~suite.errors.UnknownPluginError` here, listing the valid ones."""
    answers: dict[str, Availability] = {}
    remote = []
    for name in dict.fromkeys(names):
        cls = load_device(name)
        if cls.traits.probe_claims_device or precisions:
            remote.append(name)
        else:
            answers[name] = cls.availability()
    if remote:
        answers.update(_probe_elsewhere(remote, precisions))
    return {name: answers[name] for name in dict.fromkeys(names)}


def _probe_elsewhere(names: list[str], precisions: bool) -> dict[str, Availability]:
    argv = [sys.executable, "-m", "suite.devices.probe", *names] + (["--precisions"] if precisions else [])
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
        answers = json.loads(done.stdout.strip().splitlines()[-1]) if done.stdout.strip() else None
    except subprocess.TimeoutExpired:
        why = f"the device probe did not answer within {PROBE_TIMEOUT_S:g} s"
        return {name: Availability(False, why) for name in names}
    except (OSError, ValueError) as exc:
        return {name: Availability(False, f"the device probe failed: {exc}") for name in names}
    if not isinstance(answers, dict):
        tail = " ".join((done.stderr or "").split()[-40:]) or f"exit status {done.returncode}"
        return {name: Availability(False, f"the device probe failed: {tail}") for name in names}
    return {name: Availability(bool(a["available"]), str(a["reason"]), dict(a["details"]))
            for name, a in answers.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m suite.devices.probe", description=__doc__.split("\n\n")[0])
    parser.add_argument("devices", nargs="+")
    parser.add_argument("--precisions", action="store_true", help="set each available device up and list the "
                                                                  "precisions it runs")
    args = parser.parse_args(argv)
    answers = {name: _ask(name, args.precisions) for name in args.devices}
    sys.stdout.flush()
    print(json.dumps(answers, default=str))  # the last line of stdout: a vendor library may print before it
    return 0


if __name__ == "__main__":
    sys.exit(main())
