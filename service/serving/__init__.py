"""The serving process: the app of `posenc serve` with gRPC beside it (`process`), and how uvicorn runs it
(`server`: the connection protocol, the drain of both protocols, the exit status)."""
