"""The wire format: protobuf stubs of ``protos/negt2i/v1`` (``negt2i.wire.v1``), the one adapter between
protobuf and core types (``negt2i.wire.adapter``), the stage-service handlers and the proto lint.

Importing this package imports nothing heavy; its modules need ``protobuf`` (the ``serving`` extra).
"""
