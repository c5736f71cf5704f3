"""SimPy orchestration: the transport and the world of peers, samplers and curators."""
