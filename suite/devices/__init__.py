"""Device adapters: one small module per device, registered in the ``suite.devices`` group."""

from suite.devices.base import Availability, DeviceAdapter, DeviceMemory

__all__ = ["Availability", "DeviceAdapter", "DeviceMemory"]
