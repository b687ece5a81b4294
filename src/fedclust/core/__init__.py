"""What every family uses and no family owns: the protocol shape, the message
codec, validation, random streams, exceptions, k-means kernels, robust
aggregation and the registry."""
