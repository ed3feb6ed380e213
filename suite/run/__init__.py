"""Running configurations: the matrix (:mod:`.matrix`), launching one configuration in a fresh process
(:mod:`.launch`), that process itself (:mod:`.process`), the step loop it shares with the pytest plugin and
bench-overhead (:mod:`.steps`), the pytest plugin (:mod:`.pytest_plugin`) and bench-overhead (:mod:`.overhead`)."""
