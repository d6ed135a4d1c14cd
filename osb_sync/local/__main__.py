"""Run the local server in the foreground: `python -m osb_sync.local [--port 8080] ...`."""

from __future__ import annotations

import argparse
import logging

from .server import LocalServer


def main(argv: list[str] | None = None) -> None:
    """Parse the command line and serve until Ctrl-C."""
    parser = argparse.ArgumentParser(prog="python -m osb_sync.local", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--min-timeout", type=int, default=60)
    parser.add_argument("--pending-seconds", type=float, default=0.0)
    parser.add_argument(
        "--unenforced-network-policy", choices=("refuse", "accept"), default="refuse"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    server = LocalServer(
        args.host,
        args.port,
        api_key=args.api_key,
        min_timeout=args.min_timeout,
        pending_seconds=args.pending_seconds,
        unenforced_network_policy=args.unenforced_network_policy,
    )
    server.serve_forever()


if __name__ == "__main__":
    main()
