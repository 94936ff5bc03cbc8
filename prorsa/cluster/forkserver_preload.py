"""The first module the forkserver of a run's worker processes imports (worker_setup.py): from
here on it ignores SIGINT, and every worker it forks starts ignoring it too.

An import with an effect, on purpose: the forkserver restores, in each child it forks, the handlers
it had before its own loop began, that is, whatever its preloads left. Nothing else imports this.
"""

import signal

signal.signal(signal.SIGINT, signal.SIG_IGN)
