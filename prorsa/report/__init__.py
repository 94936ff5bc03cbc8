"""`prorsa report`: figures and a Markdown summary read back from stored runs and sweep Datasets."""
