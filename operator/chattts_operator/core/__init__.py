"""What every feature shares: the one Kubernetes client (kube), the list+watch loop, status
conditions, Events, label/annotation/field-manager names, settings read once, the operator's
metrics and an injectable clock. Imports nothing of ours but ``api``."""
