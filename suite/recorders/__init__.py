"""Recorders: where results go after the results folder (MLflow), through one MLflow gateway."""

from suite.recorders.base import Recorder
from suite.recorders.mlflow_gateway import MlflowGateway, default_tracking_uri
from suite.recorders.mlflow_recorder import MlflowRecorder

__all__ = ["MlflowGateway", "MlflowRecorder", "Recorder", "default_tracking_uri"]
