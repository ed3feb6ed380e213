"""Named exceptions. Every :class:`SuiteError` is reported by the CLI as one clear line."""


class SuiteError(Exception):
    """Base class for errors caused by the user's input or environment, not by a bug."""


class ConfigError(SuiteError, ValueError):
    """A configuration value is invalid; the message names the field and what is valid."""


class UnknownPluginError(SuiteError, LookupError):
    """A workload, device or preset name is not registered; the message lists the valid names."""

    def __str__(self) -> str:  # LookupError would quote the message like a dict key
        return str(self.args[0]) if self.args else ""


class DeviceUnavailableError(SuiteError):
    """A requested device cannot be used here. Never a reason to fall back to another device."""


class DatasetError(SuiteError):
    """The dataset cannot be used (missing path, missing column, unreadable sample...)."""


class ResultsFolderError(SuiteError):
    """A results folder cannot be used: in use by another process, holding another matrix, unreadable or
    invalid. The message names the file and what is wrong."""


class RecordEdited(ResultsFolderError):
    """A run record whose own parts contradict each other (its losses and their digest): edited by hand or corrupted.
    Readers refuse it as any unusable folder; ``suite audit`` calls it what it is, a FAIL."""


class LossDigestMismatch(ValueError):
    """:meth:`suite.results.record.RunResult.from_dict`: the recorded losses do not give the recorded digest."""


class RecordingError(SuiteError):
    """A result could not be persisted (e.g. the disk is full). The result itself is kept in memory."""
