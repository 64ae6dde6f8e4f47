"""Gang scheduling as small plugins behind one interface (gang.base.GangPlugin).

A plugin adds its objects (a PodGroup) to the job's children and patches the
pods (scheduler name, group labels/annotations). The builders ask the plugin
named in spec.runPolicy.gang; they never branch on scheduler names themselves.
"""

from __future__ import annotations

from rlkube_api.rljob import RLJob
from rlkube_operator.gang.base import GangPlugin, NoGang, PodSchedulingPatch
from rlkube_operator.gang.coscheduling import Coscheduling
from rlkube_operator.gang.kueue import Kueue
from rlkube_operator.gang.volcano import Volcano

PLUGINS: dict[str, GangPlugin] = {p.name: p for p in (Volcano(), Coscheduling(), Kueue())}

__all__ = ["PLUGINS", "GangPlugin", "PodSchedulingPatch", "plugin_for"]


def plugin_for(job: RLJob) -> GangPlugin:
    gang = job.spec.run_policy.gang
    return NoGang() if gang is None else PLUGINS[gang.scheduler]
