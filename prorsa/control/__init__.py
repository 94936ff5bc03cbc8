"""The control plane: policies that choose engine roles, the demand forecast and lifecycle tracking
they plan from, the allocator and its split search, cells of engine groups, trajectory scheduling."""
