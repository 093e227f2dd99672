"""What ``episodestream doctor`` found: per check, the episodes that pass, fail or were not checked,
and the first few failures with their file, episode and the reader's own message; as text a person
reads in a minute, or as one JSON object."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from episodestream._format.files import SourceStats
from episodestream.tools.doctor._checks import BY_NAME, CHECKS

SHOWN_FAILURES = 5  # failures kept per check (the rest are counted)
_EPISODE_IN_MESSAGE = re.compile(r"\(episode_index (\d+)\)")


@dataclass(frozen=True)
class Failure:
    """One failed check: the episode (None for a dataset-wide check whose error names none), the
    dataset-relative file its message names (None when it names none of the episode's files),
    and the error as the reader raised it."""

    check: str
    episode: int | None
    file: str | None
    error: str  # the exception's type name
    message: str

    @classmethod
    def of(cls, check: str, error: BaseException, *, episode: int | None = None, files: tuple[str, ...] = (),
           root: str | None = None) -> Failure:
        """``error`` as a failure of ``check``; its file is the first of ``files`` its message names, or
        (a dataset-wide check) the path it names below ``root``, the dataset's description."""
        message = " ".join(str(error).split())  # one line, whatever the error's own line breaks
        if episode is None and (found := _EPISODE_IN_MESSAGE.search(message)):
            episode = int(found.group(1))  # a metadata error names the episode whose row is off
        named = next((relpath for relpath in files if relpath in message), None)
        if named is None and root is not None and (below := re.search(re.escape(root.rstrip("/")) + r"/([^\s:(]+)",
                                                                      message)):
            named = below.group(1).rstrip("/")
        return cls(check, episode, named, type(error).__name__, message)

    def as_json(self) -> dict[str, Any]:
        return {"episode": self.episode, "file": self.file, "error": self.error, "message": self.message}


@dataclass
class CheckResult:
    """One check's tally. A dataset-wide check has no episode counts: ``passed`` says it all."""

    name: str
    passed_episodes: int = 0
    failed_episodes: int = 0
    skipped_episodes: int = 0  # not checked: a check they need failed first (their rows unreadable)
    failures: list[Failure] = field(default_factory=list)  # the first SHOWN_FAILURES, by episode
    ran: bool = True  # False: the metadata did not read, so this check could not run
    absent: bool = False  # the dataset has no feature of this kind (no images, video or language): nothing to check

    @property
    def passed(self) -> bool:
        return self.ran and not self.failed_episodes

    def add_failure(self, failure: Failure) -> None:
        self.failed_episodes += 1
        self.failures.append(failure)
        if len(self.failures) > SHOWN_FAILURES:  # results arrive out of order: keep the lowest episodes
            self.failures.sort(key=lambda f: (f.episode is None, f.episode or 0))
            del self.failures[SHOWN_FAILURES:]


@dataclass
class DoctorReport:
    source: str
    codebase_version: str | None
    episodes_selected: int
    frames_selected: int
    decode: str
    jobs: int
    seconds: float
    checks: dict[str, CheckResult]
    fetched: SourceStats = field(default_factory=SourceStats)  # a remote source's reads, every process's

    @property
    def clean(self) -> bool:
        return all(result.passed for result in self.checks.values())

    @property
    def exit_code(self) -> int:
        return 0 if self.clean else 1

    def as_json(self) -> dict[str, Any]:
        return {"source": self.source, "codebase_version": self.codebase_version,
                "episodes": self.episodes_selected, "frames": self.frames_selected, "decode": self.decode,
                "jobs": self.jobs, "seconds": round(self.seconds, 3), "clean": self.clean,
                "fetched": dataclasses.asdict(self.fetched),
                "checks": [self._check_json(result) for result in self.checks.values()]}

    def _check_json(self, result: CheckResult) -> dict[str, Any]:
        check = BY_NAME[result.name]
        out: dict[str, Any] = {"name": check.name, "scope": check.scope, "covers": check.covers,
                               "ran": result.ran, "absent": result.absent, "passed": result.passed}
        if check.scope == "episode":
            out.update(episodes_passed=result.passed_episodes, episodes_failed=result.failed_episodes,
                       episodes_skipped=result.skipped_episodes)
        out["failures"] = [f.as_json() for f in result.failures]
        out["more_failures"] = max(0, result.failed_episodes - len(result.failures))
        if not result.passed and result.ran:
            out["what_to_do"] = check.what_to_do
        return out

    def text(self) -> str:
        jobs = f"{self.jobs} job{'s' if self.jobs > 1 else ''}"
        frames = "every frame" if self.decode == "all" else "each episode's first and last frames"
        lines = [f"{self.source} (LeRobot {self.codebase_version or '?'}): {self.episodes_selected} episodes, "
                 f"{self.frames_selected} frames checked in {self.seconds:.1f} s ({jobs}, video decoded at {frames})"]
        if self.fetched.requests or self.fetched.lookup_requests:
            lines.append(f"fetched {self.fetched.bytes_fetched:,} bytes in {self.fetched.requests:,} requests "
                         f"({self.fetched.lookup_requests:,} look-ups; node cache: {self.fetched.cache_hits:,} hits, "
                         f"{self.fetched.cache_misses:,} misses)")
        lines.append("")
        width = max(len(c.name) for c in CHECKS)
        for result in self.checks.values():
            check = BY_NAME[result.name]
            if not result.ran:
                verdict = "not run"
            elif result.absent:
                verdict = "- (none in the dataset)"
            elif check.scope == "dataset":
                verdict = "ok" if result.passed else "FAIL"
            else:
                checked = result.passed_episodes + result.failed_episodes
                verdict = f"{result.passed_episodes}/{checked} ok" + ("" if result.passed else " FAIL")
                if result.skipped_episodes:
                    verdict += f" ({result.skipped_episodes} not checked)"
            lines.append(f"  {check.name:<{width}}  {verdict:<24} {check.covers}")
        for result in self.checks.values():
            if result.passed or not result.ran:
                continue
            check = BY_NAME[result.name]
            count = (f"{result.failed_episodes} of {result.failed_episodes + result.passed_episodes} episodes fail"
                     if check.scope == "episode" else "fails")
            lines += ["", f"{check.name}: {count}"]
            for failure in result.failures:
                where = " ".join(part for part in (f"episode {failure.episode}" if failure.episode is not None
                                                   else "", failure.file or "") if part)
                lines.append(f"  {where or 'dataset'}: {failure.error}: {failure.message}")
            if result.failed_episodes > len(result.failures):
                lines.append(f"  ... and {result.failed_episodes - len(result.failures)} more episodes")
            lines.append(f"  what to do: {check.what_to_do}")
        not_run = [r.name for r in self.checks.values() if not r.ran]
        failed = [r.name for r in self.checks.values() if r.ran and not r.passed]
        lines.append("")
        if failed:
            lines.append(f"defects found by {len(failed)} check(s): {', '.join(failed)}"
                         + (f"; not run until the metadata reads: {', '.join(not_run)}" if not_run else ""))
        else:
            lines.append("no defects found")
        return "\n".join(lines)
