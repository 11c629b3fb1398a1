"""Generated protobuf and gRPC stubs for package baton.v1 (do not edit by hand; `make protos`)."""
