"""The foundation layer: what every other package builds on, importing nothing else of headprobe (and not
torch), so the trainer, the figures and every layer above the model can use it.

==========  ===========================================================================================
errors      ``HeadprobeError``, the base of every error raised on purpose; ``SettingError``
choice      ``Choice``: typed choices among named values (``str`` enums), one message for an unknown value
settings    ``setting``: a settings field carrying its command-line help, flag and list form
lazy        ``lazy_exports``: a package's names loaded on first use
atomic      atomic files and folders, ``folder_lock`` (one writer per folder), the sweep of what killed
            writers left behind
outputs     ``claim``: the one rule for what a command may write where (never an input; only its own kind)
cleanup     ``CLEANUPS``: what an interrupted process must undo even when ended outright
paths       ``not_a`` (a path of the wrong kind, said plainly), ``read_utf8``
ranks       ``Ranks``: splitting work over the processes ``torchrun`` started
progress    ``Progress``: how long work reports itself (the library reports, the command line draws);
            ``Silent``
resume      ``resume_key``: what decides a work item's numbers; what a rerun says (``done_earlier``) and
            refuses (``repeated_lengths``, ``changed_inputs``)
identity    ``checkpoint_identity``: what tells a checkpoint from every other, read without a weight
steps       a training run's step folders: ``list_steps``, ``select_steps`` (``--steps all|every:K|LIST``),
            ``StepInfo`` (the step and tokens of one)
==========  ===========================================================================================
"""
