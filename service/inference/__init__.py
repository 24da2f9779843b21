"""Inference: the data plane (`dataplane`) every protocol reaches, its HTTP adapter (`routes`), and below it the model
views (`model_inputs`, `triton_config`), the protocol codecs (`codecs/`), shared memory (`shared_memory/`) and the
runtime (`runtime/`: the repository, calibration, the engine, the batcher)."""
