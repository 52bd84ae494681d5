"""The laptop (or Cloud Build) side: the Ray Jobs API through a bounded client (jobs_api), what a
job uploads (uploads), and `kubectl port-forward` to the cluster's services (port_forward)."""
