"""Write the KServe v2 / Triton gRPC protocol as a FileDescriptorSet, for `protoc --descriptor_set_in`.

    python scripts/grpc_descriptors.py OUT.pb

The descriptors are those of the messages posenc serves: `tritonclient.grpc`'s generated `model_config_pb2` and
`service_pb2` (Triton's model_config.proto and grpc_service.proto, github.com/triton-inference-server/common,
BSD-3-Clause). Clients in other languages generate their stubs from this file (scripts/grpc-client-test.sh), so
no copy of the protocol is kept in this repository.
"""

from __future__ import annotations

import sys
from pathlib import Path

from google.protobuf import descriptor_pb2
from tritonclient.grpc import model_config_pb2, service_pb2


def descriptor_set() -> descriptor_pb2.FileDescriptorSet:
    files = descriptor_pb2.FileDescriptorSet()
    for module in (model_config_pb2, service_pb2):  # dependencies first
        module.DESCRIPTOR.CopyToProto(files.file.add())
    return files


def main() -> int:
    if len(sys.argv) != 2:
        raise SystemExit("usage: grpc_descriptors.py OUT.pb")
    files = descriptor_set()
    Path(sys.argv[1]).write_bytes(files.SerializeToString())
    print(" ".join(f.name for f in files.file))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
