"""The status function: from the job and what is observed of its children to the
plan of one pass: the new status, the Events to emit and the actions, in order.
Pure: no I/O, time passed in.

The decision is a chain of small rules, tried in a fixed order; the first that
settles the job's fate ends it (RULES in compute.py):
- invalid child: the API server refused a child as invalid → Failed/InvalidChild, no pods
  (a later spec generation starts the job again);
- suspended: spec.suspend → Suspended, StatefulSets at zero;
- past deadline: activeDeadlineSeconds → Failed/DeadlineExceeded;
- driver succeeded: the controller pod's container exits 0 → Succeeded;
- restart begun: pods of a newer attempt than the status's (a restart whose status write
  was lost) → that restart is taken up;
- gang failed: a pod of the current attempt fails (or is replaced) → the failure policy
  (rlkube_operator/failure_policy.py) decides: Failed at once (the trainer's configuration error, a FailJob
  rule), or the gang restarts (restartCount + 1), counted against backoffLimit unless the
  pod was disrupted or an Ignore rule matched; past backoffLimit, Failed/BackoffLimitExceeded;
- missing reference: a ConfigMap, Secret or PersistentVolumeClaim the pods name does not
  exist (looked up only before the pods are created) → Pending, Created=False/MissingReference,
  StatefulSets at zero; the pods come once it exists; Failed after pendingTimeoutSeconds;
- does not fit: a role's memory estimate per rank exceeds its GPUs (spec.fit; looked up only
  before the pods are created) → Pending, Created=False/DoesNotFit with the numbers, no pods;
- bad image: a container that cannot start for pendingTimeoutSeconds → Failed;
- stuck before start: a scheduled pod whose containers do not start for
  pendingTimeoutSeconds, with the kubelet's reason (FailedMount, ...) → Failed;
- pods not created: a StatefulSet failing to create its pods (FailedCreate: a missing
  ServiceAccount, a quota, a Pod Security violation) → at once Running=False/PodsNotCreated,
  naming it with the controller's message (cleared once the pods are created); still failing
  after pendingTimeoutSeconds → Failed/PodsNotCreated;
- awaiting admission: pods held by Kueue's admission gate → Running=False/AwaitingAdmission,
  naming the queue; pendingTimeoutSeconds does not run out on a queue (it may hold a job for hours);
- unschedulable: pods Pending with no node that fits for that long → the Unschedulable
  condition, naming the role;
- readiness: Running once every pod is ready.
A terminal job never gets pods again: once its end is written, its StatefulSets go to zero and
every pod is deleted with FINISHED_GRACE_SECONDS; its children go after ttlSecondsAfterFinished.

The modules, one job each:
- one_pass.py: the facts a pass reads (Observed), the conditions and Events it sets, its Fate;
- before_pods.py: the rules before the pods exist (invalid child, missing reference, does not
  fit) and a Failed job's start again after a spec change;
- gang_rules.py: the rules about the gang (suspended, deadline, success, restart, gang failed,
  readiness);
- starting.py: the rules about pods that have not started (initialized, bad image, stuck before
  start, pods not created, awaiting admission, unschedulable);
- compute.py: RULES, compute_status and the plan it returns (an ended job's pods released, the
  old gang's deleted);
- writes.py: when the status is written.
"""

from rlkube_operator.status.compute import compute_status
from rlkube_operator.status.one_pass import Observed

__all__ = ["Observed", "compute_status"]
