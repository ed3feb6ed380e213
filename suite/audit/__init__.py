"""``suite audit``: whether a recorded matrix holds up (its records, its environment, a re-run of its headline and
the loaders' pixels), with verdicts that say PASS only when the data show it."""
