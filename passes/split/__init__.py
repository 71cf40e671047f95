"""The splitter: from one PIR training program to per-chunk sub-programs and a ``core.Plan``.

* :mod:`.core` - what every plan builder shares: the plan record (:class:`~.core.PipelinePlan`),
  the one plan opening of a schedule, and the split into per-chunk sub-programs (chunk
  completion, the B / W split of :mod:`pipesplit.ir_utils.split_backward`, extraction with
  gradient accumulation: :mod:`pipesplit.ir_utils`);
* :mod:`.pipeline` - the whole model, every rank emulated in one process
  (:func:`~.pipeline.split_and_schedule`); :mod:`.per_rank` - the whole model, one rank of a
  launch (:func:`~.per_rank.build_rank_plan`);
* :mod:`.checks` - what the pass checks on its inputs before any work;
* :mod:`.registration` - the splitter as Paddle's passes (``pipeline_scheduler_<NAME>``,
  :func:`~.registration.apply_pipeline`).

The third builder, one rank of Paddle's auto-parallel engine, is the engine's
(:mod:`pipesplit.passes.engine.engine_rank`).  The user's entry points are re-exported by
:mod:`pipesplit.passes`.
"""
