"""What each `prorsa` command does once cli.py has parsed its arguments: checks, wiring, output."""
