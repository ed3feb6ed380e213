"""Stand-in plugins for tests, registered through the dist-info folder beside this package.

Put ``tests/plugins`` on PYTHONPATH (parent and child processes) to make them discoverable.
"""

from suite.devices.base import Availability
from suite.devices.cpu import CPUAdapter


class AbsentStandInAdapter(CPUAdapter):
    """A device that is never present: exercises the unavailable-device path end to end."""

    name = "absent-standin"
    description = "test stand-in for a device that is not installed"

    @classmethod
    def availability(cls) -> Availability:
        return Availability(False, "stand-in accelerator is not present on this machine")
