"""What a run leaves behind: the results folder (:mod:`.files` and :mod:`.store`, its only readers and writers), run
records (:mod:`.record`), manifests, MLPerf logs and environment facts."""
