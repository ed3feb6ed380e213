"""How a configuration process is started: its command (python, or torchrun for several processes), environment and
address-space limit, started ahead of its turn (:class:`Standby`), and its process group signalled or killed."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

from suite.config import RunConfig
from suite.devices.base import child_environment
from suite.events import LAUNCHED_AT_ENV
from suite.registry import load_device

PROCESS_MODULE = "suite.run.process"


def address_space_limit(limit_bytes: int) -> Callable[[], None]:
    def apply() -> None:  # runs in the child between fork and exec; loader workers inherit it
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))
    return apply


def signal_group(proc: subprocess.Popen, signum: int) -> None:
    """Signal the configuration's process group (it and its loader workers, torchrun's ranks)."""
    try:
        os.killpg(proc.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def kill_group(proc: subprocess.Popen, timed_out: threading.Event) -> None:
    """The time limit passed: kill the whole configuration."""
    if proc.poll() is None:
        timed_out.set()
        signal_group(proc, signal.SIGKILL)


#: How long a node waits for the others at a configuration's rendezvous before the configuration fails.
RENDEZVOUS_JOIN_TIMEOUT_S = 600


def launcher_command(config: RunConfig, run_name: str) -> list[str]:
    """The command that starts a configuration's process(es): Python itself; torchrun standalone for several
    processes on this node; torchrun with a c10d rendezvous at ``rdzv_endpoint`` for several nodes (the same
    rendezvous id, the run's name, on every node; no restarts: a node that dies fails the configuration)."""
    if config.nnodes > 1:
        return [sys.executable, "-m", "torch.distributed.run", f"--nnodes={config.nnodes}",
                f"--nproc-per-node={config.nproc_per_node}", "--rdzv-backend=c10d",
                f"--rdzv-endpoint={config.rdzv_endpoint}", f"--rdzv-id={run_name}", "--max-restarts=0",
                f"--rdzv-conf=join_timeout={RENDEZVOUS_JOIN_TIMEOUT_S}"]
    if config.nproc_per_node > 1:  # one process per device, through torch.distributed's own launcher
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                f"--nproc-per-node={config.nproc_per_node}"]
    return [sys.executable]


def configuration_environment(config: RunConfig) -> dict[str, str]:

    return {**os.environ, "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1",
            **child_environment(load_device(config.device), config.nproc_per_node)}


def _public(environment: dict[str, str]) -> dict[str, str]:
    """The environment without private variables (a leading underscore), which libraries of the runner set for
    themselves meanwhile (MLflow's ``_MLFLOW_TELEMETRY_SESSION_ID``): they do not make a process started ahead
    unfit."""
    return {k: v for k, v in environment.items() if not k.startswith("_")}


def can_start_ahead(config: RunConfig) -> bool:
    """Whether ``config`` can run in a process started ahead of its turn (:class:`Standby`): one process, no
    torchrun (whose launcher starts the processes itself)."""
    return config.nproc_per_node == 1 and config.nnodes == 1


class Standby:
    """A configuration process started ahead of its turn (``python -m suite.run.process --standby``): the
    interpreter starts and imports what the configuration's workload and device need, then waits, idle, for its
    run folder on stdin. When the runner starts them is :func:`suite.run.matrix.run_matrix`'s rule (never while a
    configuration measures or evaluates). It is still a fresh process per configuration: nothing of another
    configuration is in it, and its memory is its own (sampled from the hand-over; its imports are resident by
    then and counted). Its stderr waits in a temporary file until the hand-over, when the process moves it into
    the run's log; a runner that dies closes its stdin, and it exits.
    """

    def __init__(self, config: RunConfig, memory_limit_bytes: int | None = None) -> None:
        if not can_start_ahead(config):
            raise ValueError(f"{config.config_id} runs under torchrun: it cannot be started ahead")
        self.config, self.memory_limit_bytes = config, memory_limit_bytes
        self._environment = configuration_environment(config)
        self._stderr = tempfile.TemporaryFile()  # handed to the child; closed at hand-over/cancel
        limit = address_space_limit(memory_limit_bytes) if memory_limit_bytes else None
        self.launched_at = time.time()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", PROCESS_MODULE, "--standby", f"{config.workload},{config.device}"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, text=True,
            env={**self._environment, LAUNCHED_AT_ENV: repr(self.launched_at)}, preexec_fn=limit,
            start_new_session=True)

    def fits(self, config: RunConfig, memory_limit_bytes: int | None) -> bool:
        """Whether this process can run ``config``: same workload, device, environment (:func:`_public`) and memory
        limit, and still alive."""
        return (can_start_ahead(config) and config.workload == self.config.workload
                and config.device == self.config.device and memory_limit_bytes == self.memory_limit_bytes
                and _public(configuration_environment(config)) == _public(self._environment)
                and self.proc.poll() is None)

    def hand_over(self, folder: Path) -> subprocess.Popen | None:
        """Give the process its run folder; from now on it is that configuration's process. ``None`` if it died
        just before (then it is cleaned up and the caller starts a fresh one)."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(f"{folder}\n")
            self.proc.stdin.close()
        except OSError:  # broken pipe: gone since fits() looked
            self.cancel()
            return None
        finally:
            self._stderr.close()
        return self.proc

    def cancel(self) -> None:
        """Not needed after all: end of input (it exits quietly), and its process group stopped."""
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:
            pass
        signal_group(self.proc, signal.SIGKILL)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._stderr.close()
