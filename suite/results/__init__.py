"""What a run leaves behind: the results folder (:mod:`.store`, its only reader and writer), run records
(:mod:`.results`), manifests, MLPerf logs and environment facts."""
