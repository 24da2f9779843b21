"""The protocol codecs: KServe v2 JSON and binary tensors (`kserve_request`, `kserve_response`, `kserve_json`) and
the gRPC protobuf messages (`protobuf`), both into one parsed request, `kserve_request.InferRequest`."""
