"""The agent side of a trajectory: workloads and task families, the turn-by-turn loop, traces,
environments with their tools and rewards, the datasets tasks come from, and importers of recorded
agent runs as traces."""
