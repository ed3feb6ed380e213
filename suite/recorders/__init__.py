"""Recorders persist results: results.json (always) and MLflow."""

from suite.recorders.base import MatrixInfo, Recorder
from suite.recorders.json_results import JsonResultsRecorder
from suite.recorders.mlflow_tracking import MlflowRecorder, default_tracking_uri

__all__ = ["JsonResultsRecorder", "MatrixInfo", "MlflowRecorder", "Recorder", "default_tracking_uri"]
