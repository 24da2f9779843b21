"""posenc's benchmarks: one entry point, `python -m bench <tables|servers|infer|batching|all> [options]`, with
sub-benchmarks on one harness (bench/harness.py: servers, load, interleaved rounds, the ratio table)."""
