"""This machine's facts: the same survey a remote host answers, run by the local sh."""

from __future__ import annotations

import subprocess

from tensorless_deploy.facts.survey import all_sections, host_facts_from_survey, survey_script
from tensorless_deploy.facts.values import HostFacts


def local_facts(models_dir: str) -> HostFacts:
    """The survey of this machine, models judged under models_dir."""
    script = survey_script(all_sections(models_dir))
    proc = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=120)
    return host_facts_from_survey(proc.stdout)
