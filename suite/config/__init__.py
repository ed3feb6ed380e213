"""Configurations: what every run of a matrix shares (:mod:`.settings`, with the values each field may take), one
configuration run (:mod:`.run`), a matrix of them (:mod:`.matrix`), and how people label and write them
(:mod:`.labels`). Each validates itself on construction and raises :class:`~suite.errors.ConfigError` naming the
field. The names below are the package's public interface."""

from suite.config.matrix import MatrixSpec
from suite.config.run import RunConfig, param_text
from suite.config.settings import (
    DEFAULT_LOADER_TIMEOUT_S,
    DEFAULT_SEED,
    DEFAULT_STEPS,
    DEFAULT_WARMUP_STEPS,
    DIVISIONS,
    ENGINE_NOTES,
    ENGINES,
    LOADERS,
    MAX_COUNT,
    MAX_GIB,
    MAX_SECONDS,
    MAX_SEED,
    PRECISIONS,
    SETUP_ALLOWANCE_S,
    STEP_ALLOWANCE_S,
    TOKENIZER_MODES,
    RunSettings,
)

__all__ = [
    "DEFAULT_LOADER_TIMEOUT_S",
    "DEFAULT_SEED",
    "DEFAULT_STEPS",
    "DEFAULT_WARMUP_STEPS",
    "DIVISIONS",
    "ENGINE_NOTES",
    "ENGINES",
    "LOADERS",
    "MAX_COUNT",
    "MAX_GIB",
    "MAX_SECONDS",
    "MAX_SEED",
    "MatrixSpec",
    "PRECISIONS",
    "RunConfig",
    "RunSettings",
    "SETUP_ALLOWANCE_S",
    "STEP_ALLOWANCE_S",
    "TOKENIZER_MODES",
    "param_text",
]
