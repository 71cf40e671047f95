"""Measuring plans: per-job costs and memory from real runs (:mod:`.profile`), and the one
re-plan through the engine with the costs every rank measured (:mod:`.replan`)."""
