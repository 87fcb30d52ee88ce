"""kwok's Stages for the test cluster: what plays the kubelet's part for pods on the fake GPU nodes.

Bound, a pod runs; with `gpufleet.io/kwok-run-s` it succeeds that many seconds after it started, with
`gpufleet.io/kwok-exit-code` (not 0) it fails with that code; a deleted pod goes when its grace period ends.
"""

from __future__ import annotations

RUN_S_ANNOTATION = "gpufleet.io/kwok-run-s"
EXIT_CODE_ANNOTATION = "gpufleet.io/kwok-exit-code"

# Placeholders are @…@, so that the braces of kwok's Go templates stay as they are.
_POD_ENDED = """\
      conditions:
      - {type: Ready, status: "False", reason: @REASON@, lastTransitionTime: {{ Now | Quote }}}
      - {type: ContainersReady, status: "False", reason: @REASON@, lastTransitionTime: {{ Now | Quote }}}
      containerStatuses:
      {{ range .spec.containers }}
      - {name: {{ .name | Quote }}, image: {{ .image | Quote }}, ready: false, started: false, restartCount: 0,
         state: {terminated: {exitCode: @EXIT_CODE@, reason: @TERMINATED@,
                              startedAt: {{ $.status.startTime | Quote }}, finishedAt: {{ Now | Quote }}}}}
      {{ end }}
      phase: @PHASE@"""
_POD_ENDS = """\
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {jq: {key: .metadata.deletionTimestamp, operator: DoesNotExist}}
    - {jq: {key: .status.phase, operator: In, values: [Running]}}
    - {jq: {key: '.metadata.annotations["@EXIT@"] // "0"', operator: @OP@, values: ["0"]}}
    - {jq: {key: '.metadata.annotations["@RUN_S@"] // .metadata.annotations["@EXIT@"]', operator: Exists}}
  # The time kwok counts the delay down to, from the pod's start (whole seconds, a fraction of run-s rounded up):
  # kwok works a delay out anew at every change of the pod, and a delay of run-s would start again each time.
  delay: {durationMilliseconds: 0, durationFrom: {jq: {expression: '(.status.startTime | fromdateiso8601)
    + (.metadata.annotations["@RUN_S@"] // "0" | tonumber) | ceil | todateiso8601'}}}
  next:
    statusTemplate: |"""
_KWOK_STAGES = """\
# Nodes: Ready at once, keeping the capacity, labels and status.images they were created with; kwok keeps
# their lease (node-lease-duration-seconds), which is all a kubelet's heartbeat is nowadays.
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata: {name: node-initialize}
spec:
  resourceRef: {apiGroup: v1, kind: Node}
  selector:
    matchExpressions:
    - {jq: {key: '.status.conditions.[] | select(.type == "Ready") | .status', operator: NotIn, values: ["True"]}}
  next:
    statusTemplate: |
      conditions:
      {{ range NodeConditions }}
      - {type: {{ .type | Quote }}, status: {{ .status | Quote }}, reason: {{ .reason | Quote }},
         message: {{ .message | Quote }}, lastHeartbeatTime: {{ Now | Quote }}, lastTransitionTime: {{ Now | Quote }}}
      {{ end }}
      addresses:
      - {address: {{ NodeIP | Quote }}, type: InternalIP}
      - {address: {{ NodeName | Quote }}, type: Hostname}
      phase: Running
---
# Pods bound to a kwok node: Running, containers started and ready, until deleted or ended below.
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata: {name: pod-ready}
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {jq: {key: .metadata.deletionTimestamp, operator: DoesNotExist}}
    - {jq: {key: .status.phase, operator: In, values: [Pending]}}
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      - {type: Initialized, status: "True", lastTransitionTime: {{ $now | Quote }}}
      - {type: Ready, status: "True", lastTransitionTime: {{ $now | Quote }}}
      - {type: ContainersReady, status: "True", lastTransitionTime: {{ $now | Quote }}}
      {{ range .spec.readinessGates }}
      - {type: {{ .conditionType | Quote }}, status: "True", lastTransitionTime: {{ $now | Quote }}}
      {{ end }}
      containerStatuses:
      {{ range .spec.containers }}
      - {name: {{ .name | Quote }}, image: {{ .image | Quote }}, ready: true, started: true, restartCount: 0,
         state: {running: {startedAt: {{ $now | Quote }}}}}
      {{ end }}
      {{ with .spec.initContainers }}
      initContainerStatuses:
      {{ range . }}
      - {name: {{ .name | Quote }}, image: {{ .image | Quote }}, ready: true, restartCount: 0,
         state: {terminated: {exitCode: 0, reason: Completed, finishedAt: {{ $now | Quote }}}}}
      {{ end }}
      {{ end }}
      hostIP: {{ NodeIPWith .spec.nodeName | Quote }}
      {{ with .metadata }}
      podIP: {{ PodIPWith $.spec.nodeName (or $.spec.hostNetwork false) .uid .name .namespace | Quote }}
      {{ end }}
      phase: Running
      startTime: {{ $now | Quote }}
---
# Annotated pods end: Succeeded after run-s seconds, or Failed with a non-zero exit-code (after run-s, or at once).
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata: {name: pod-succeed}
spec:
@SUCCEED@
@SUCCEEDED@
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata: {name: pod-fail}
spec:
@FAIL@
@FAILED@
---
# A deleted pod goes when its grace period ends (the delay counts down to its deletionTimestamp), as a kubelet
# removes it once its containers stopped; kwok's stock stage picks a random moment before that instead.
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata: {name: pod-delete}
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {jq: {key: .metadata.deletionTimestamp, operator: Exists}}
  delay: {durationMilliseconds: 0, durationFrom: {jq: {expression: .metadata.deletionTimestamp}}}
  next:
    delete: true
"""


def _fill(text: str, **values: str) -> str:
    for key, value in values.items():
        text = text.replace(f"@{key}@", value)
    return text


_SUCCEEDED = _fill(_POD_ENDED, REASON="PodCompleted", EXIT_CODE="0", TERMINATED="Completed", PHASE="Succeeded")
_EXIT_CODE = '{{ index $.metadata.annotations "@EXIT@" | atoi }}'
_FAILED = _fill(_POD_ENDED, REASON="PodFailed", EXIT_CODE=_EXIT_CODE, TERMINATED="Error", PHASE="Failed")
_STAGES = _fill(_KWOK_STAGES, SUCCEED=_fill(_POD_ENDS, OP="In"), FAIL=_fill(_POD_ENDS, OP="NotIn"))
KWOK_STAGES = _fill(
    _fill(_STAGES, SUCCEEDED=_SUCCEEDED, FAILED=_FAILED), RUN_S=RUN_S_ANNOTATION, EXIT=EXIT_CODE_ANNOTATION
)
