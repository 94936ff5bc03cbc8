"""What a command prints while it works: one clock on every line, a run's progress, the engines'
start-up, the policy's decisions in words."""
