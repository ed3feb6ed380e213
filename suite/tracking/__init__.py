"""The MLflow home: every MLflow read and write of the suite, and the only package that imports ``mlflow``.

:mod:`.mlflow_gateway` holds the client (deadlines, retries, the tag names), :mod:`.mlflow_recorder` records a
matrix as it runs (:mod:`.base`: the recorder interface), :mod:`.system_metrics` samples the host beside it,
:mod:`.upload` records a results folder afterwards, :mod:`.reading` reads runs back (rows, records, a report's
view) and :mod:`.side_runs` logs audits and tuning sweeps.
"""
