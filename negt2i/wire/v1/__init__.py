"""Generated protobuf / gRPC stubs of ``protos/negt2i/v1`` (made by ``scripts/protos/codegen.py``)."""
