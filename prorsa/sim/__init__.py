"""The simulator: virtual time, the same brain and emulated engines as a live run."""
