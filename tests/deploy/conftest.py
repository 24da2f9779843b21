"""The deployment files and the wheel: container build files, Kubernetes and KServe manifests, packaging."""
