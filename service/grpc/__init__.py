"""The gRPC transport: the server (`server`: health, reflection, limits, drain) and the KServe v2 / Triton servicer
(`servicer`), an adapter over the inference data plane."""
