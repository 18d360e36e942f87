"""The cgsvc client library and the `cgsvc-cli` command."""
