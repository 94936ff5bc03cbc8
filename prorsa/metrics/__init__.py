"""What a run records and what is made of it: the recorder, the run directory and journal on
disk, progress while it goes, and the reports and figures read back from stored runs."""
