"""The gRPC server: configuration, auth, the request pipeline and the services."""
