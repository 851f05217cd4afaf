"""What the deployment checks share: the repository root, running a
command, and reporting a failed check as one line and exit status 1."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, **kw)


def main_of(main):
    """Runs a check's main when the file is the program."""
    try:
        main()
    except AssertionError as e:
        print(f"FAILED: {e}", file=sys.stderr)
        sys.exit(1)
