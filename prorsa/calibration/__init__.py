"""`prorsa calibrate --from-run`: a hardware profile corrected to live runs by simulating them again."""
