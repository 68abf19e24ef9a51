"""This machine's facts: the same survey a remote host answers, run by the local sh."""

from __future__ import annotations

import subprocess
from types import TracebackType

from tensorless_deploy.facts.survey import all_sections, host_facts_from_survey, survey_script
from tensorless_deploy.facts.values import HostFacts

SURVEY_TIMEOUT_S = 120


def local_facts(models_dir: str) -> HostFacts:
    """The survey of this machine, models judged under models_dir."""
    with LocalSurvey(models_dir) as survey:
        return survey.facts()


class LocalSurvey:
    """The survey of this machine, started now and read when asked: a command starts it first
    and decides the rest (catalog, imports, sizing) while it runs (bench/run_overhead.py). A
    survey never read is killed on leaving the ``with``."""

    def __init__(self, models_dir: str) -> None:
        script = survey_script(all_sections(models_dir))
        self.proc = subprocess.Popen(
            ["sh", "-c", script],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self._facts: HostFacts | None = None

    def facts(self) -> HostFacts:
        if self._facts is None:
            out, _ = self.proc.communicate(timeout=SURVEY_TIMEOUT_S)
            self._facts = host_facts_from_survey(out)
        return self._facts

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> LocalSurvey:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
