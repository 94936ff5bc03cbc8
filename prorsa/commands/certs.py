"""`prorsa certs DIR`: test TLS certificates where a cluster file's tls: section looks for them.

    make_test_certs(directory, days)   ca.pem, node.pem, node-key.pem in DIR (made if missing);
                                       exit 2 where one is there already (never overwritten) or
                                       the cryptography package is not installed
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import click

from prorsa.commands.errors import fail

NAMES = ("ca.pem", "node.pem", "node-key.pem")  # cluster/slurm-tls.yaml's ca_file, cert, key


def make_test_certs(directory: str, days: int) -> None:
    if importlib.util.find_spec("cryptography") is None:  # what make_certs signs with
        fail("prorsa certs needs the cryptography package: pip install 'prorsa[tls]' (or make them with "
             "openssl, as cluster/slurm-tls.yaml shows)")
    where = Path(directory)
    paths = [where / name for name in NAMES]
    if there := [str(p) for p in paths if p.exists()]:
        fail(f"{', '.join(there)}: already there; prorsa certs never overwrites a certificate")
    try:
        where.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        fail(f"{directory}: cannot make it ({e.strerror})")
    from prorsa.cluster.certs import make_certs

    make_certs(*paths, days=days)
    click.echo(f"wrote {', '.join(map(str, paths))} (test certificates, valid {days} days)")
