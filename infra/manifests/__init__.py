"""Kubernetes manifests derived from the environment config (no cdktf import: answers in ~1 s)."""
