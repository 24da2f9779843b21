"""Arrays on the wire, both ways: `encode` writes bundles (safetensors, npy, raw, JSON), `decode` reads
uploaded tensors with the same rules and bounds."""
