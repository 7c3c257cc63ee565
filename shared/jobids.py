"""What a batch job id is -- ``42``, an array's task ``42_7`` -- in one place: the wire model's pattern
(:class:`~coorm.shared.protocol.BatchControl`) and the same rule as string tests, for the command line's light
path, which cannot import ``re`` (10-15 ms) on every ``coorm cancel``."""

from __future__ import annotations

from coorm.shared.when import digits

JOB_ID_PATTERN = r"^[0-9]{1,18}(_[0-9]{1,9})?$"
MAX_JOB_DIGITS, MAX_TASK_DIGITS = 18, 9


def is_job_id(text: str) -> bool:
    """Whether ``text`` matches :data:`JOB_ID_PATTERN`."""
    job, underscore, task = text.partition("_")
    return (digits(job) and len(job) <= MAX_JOB_DIGITS
            and (not underscore or (digits(task) and len(task) <= MAX_TASK_DIGITS)))
