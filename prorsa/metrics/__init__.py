"""What a run records: the recorder, the run directory, journal and outputs on disk, the prior read
from an earlier run, progress and the console while it goes (reports read back: prorsa/report)."""
