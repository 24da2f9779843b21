"""Inference: the model repository, the engine that runs its models, the batcher, the run bound, devices,
the KServe v2 codec and input checks, shared memory, and their routes."""
