"""Pure builders, one module per child kind: statefulset, service, configmap, rbac
(PodGroups come from the gang plugins). `rlkube_operator.desired` assembles them.
references reads the built pod templates for the objects the pods name."""
