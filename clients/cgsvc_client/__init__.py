"""The cgsvc client library and the `cgsvc-cli` command."""

import os

# gRPC's C core logs some failures itself (a failed TLS handshake, at INFO) on stderr, beside the
# error this client reports with the same cause and the flag that fixes it. Its verbosity is read
# once, when grpc is first imported, so it is set here, before any module of this package imports
# grpc; a GRPC_VERBOSITY the user set stands.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
