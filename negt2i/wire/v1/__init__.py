"""Generated protobuf / gRPC stubs of ``protos/negt2i/v1`` (do not edit; see ``negt2i.wire.codegen``)."""
