"""Measuring plans: the one profiler of jobs (:mod:`.profile`: the jobs a run executed,
recorded by Paddle's profiler, and a model's jobs probed one type at a time into a cost file),
a whole step of each schedule against the simulator (:mod:`.calibration`), the costs of the one
re-plan through the engine that every rank measured (:mod:`.replan`) and their bytes under a
memory budget (:mod:`.memory_budget`)."""
