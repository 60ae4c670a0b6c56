"""``headprobe study``: the study end to end on a grid headprobe trains (``make demo`` runs its demo
profile on the toy grid).

========  ==========================================================================================
settings  :class:`StudySettings`: what is measured on the trained runs (the recipe's ``study`` section)
job       :func:`run_study`: train through the trainer plugin, probe, analyze, evaluate, tabulate
tables    the study's tidy tables and the comparisons drawn from them (mean and spread over seeds)
========  ==========================================================================================
"""

from headprobe.study.job import StudyReport, run_study
from headprobe.study.settings import StudyError, StudySettings

__all__ = ["StudyError", "StudyReport", "StudySettings", "run_study"]
