"""Pure builders, one module per child kind: statefulset, service, configmap, secret,
rbac, networkpolicy (PodGroups come from the gang plugins), with their parts (labels,
rendezvous env, topology, pod template overrides). `rlkube_operator.desired` assembles
them. references reads the built pod templates for the objects the pods name."""
