"""`prorsa serve`: an OpenAI-compatible endpoint whose conversations are Prorsa trajectories."""
