"""What every job (``analyze``, ``ruler eval``, ``shortctx eval``, ``ablate``, the study) shares, above the
models it runs. One module per topic; the package imports none of them, so a light one (``parts``) loads
without torch. The torch-free helpers every layer may use lie in :mod:`headprobe.core`: ``progress``
(``Progress``, ``Silent``), ``resume`` (``resume_key`` and what a rerun says), ``identity`` (a checkpoint's
identity).

===========  ==========================================================================================
job          the one shape of every such command: ``Job`` (a ``plan`` per checkpoint), ``Plan``, ``run_job``,
             ``run_one``, ``share`` (the items dealt out among ``torchrun``'s processes)
checkpoints  a job over many checkpoints: ``run_models`` / ``run_each`` (failures isolated),
             ``CHECKPOINT_ERRORS``, the results folder names (``checkpoint_name``, ``unique_names``)
folders      an output folder held for a job: ``job_folder`` (one run), ``held_folder`` (a study's steps)
record       ``RunReport`` (what a run produced) and ``OUT/run.json`` (``write_run_record``,
             ``merged_settings``, ``read_record``)
provenance   ``versions``, ``table_meta`` and ``write_results`` (a table's metadata); ``not_of`` /
             ``tables_of`` (whose rows a table holds)
parts        ``Parts`` (one model's finished work items) and ``check_parts`` (a rerun checked against them)
memory       the memory budget: ``available_memory``, ``MemoryBudget``, ``require_fits``, ``DoesNotFit``
===========  ==========================================================================================
"""
