"""Generated wire contract of cgsvc.v1; regenerate with `make protos`."""
