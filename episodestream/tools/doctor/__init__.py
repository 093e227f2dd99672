"""``episodestream doctor``: every check the readers make, on every selected episode, before training.

    from episodestream.tools.doctor import run_doctor

    report = run_doctor("data/my_dataset", decode="ends")
    print(report.text())  # report.as_json() for machines; report.exit_code is 0 when clean
"""

from episodestream.tools.doctor._checks import CHECKS, Check
from episodestream.tools.doctor._report import CheckResult, DoctorReport, Failure
from episodestream.tools.doctor._run import WorkerDied, run_doctor

__all__ = ["CHECKS", "Check", "CheckResult", "DoctorReport", "Failure", "WorkerDied", "run_doctor"]
