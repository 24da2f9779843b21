"""Inference in process: repository and engine, batcher, run bound, KServe codec and routes, shared memory."""
