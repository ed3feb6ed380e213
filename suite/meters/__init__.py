"""Meters measure; they never decide: step timing (:mod:`.timing`), host RAM (:mod:`.host_ram`), set-up phases
(:mod:`.setup`) and other work on the machine (:mod:`.contention`)."""
