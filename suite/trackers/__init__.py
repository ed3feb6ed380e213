"""Trackers measure; they never decide. Step timing and host RAM sampling live here."""

from suite.trackers.host_ram import HostRamPeak, HostRamSampler
from suite.trackers.timing import StepTimer, StepTiming

__all__ = ["HostRamPeak", "HostRamSampler", "StepTimer", "StepTiming"]
