"""RULER-style long-context evaluation: the 13 tasks, generated offline and fitted to any tokenizer,
scored exactly as RULER scores them (see docs/ruler.md)."""

from headprobe.ruler.generate import RulerError, RulerGenerator
from headprobe.ruler.scoring import postprocess, string_match_all, string_match_part
from headprobe.ruler.tasks import TASKS, Task, resolve_tasks

__all__ = [
    "TASKS",
    "RulerError",
    "RulerGenerator",
    "Task",
    "postprocess",
    "resolve_tasks",
    "string_match_all",
    "string_match_part",
]
