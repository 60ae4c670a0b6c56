"""``headprobe study``: the study end to end on a grid headprobe trains (``make demo`` runs its demo
profile on the toy grid).

=========  ==========================================================================================
settings   :class:`StudySettings`: what is measured on the trained runs (the recipe's ``study`` section)
job        :func:`run_study`: train through the trainer plugin, then :func:`measure`: probe, analyze,
           evaluate, tabulate (also on its own, for a grid trained earlier: the ``analyses/`` scripts)
tables     the study's tidy tables and the comparisons drawn from them (mean and spread over seeds)
verdicts   :func:`verdicts`: a verdict per finding of the study (holds, opposite, inconclusive) from its tables
intervals  95% intervals: a bootstrap over seeds, Wilson's for one seed's trials
exports    a trained grid handed to evaluators outside headprobe (Hugging Face folders), by path
real       ``headprobe demo --real``: a real pretrained model through every analysis
=========  ==========================================================================================
"""

from headprobe.study.job import MEASUREMENTS, StudyReport, measure, run_study
from headprobe.study.settings import StudyError, StudySettings

__all__ = ["MEASUREMENTS", "StudyError", "StudyReport", "StudySettings", "measure", "run_study"]
