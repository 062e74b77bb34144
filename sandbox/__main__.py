"""``python -m sandbox --host 127.0.0.1 --port PORT [--config FILE] [--log-level LEVEL]``.

``dispatcher sandbox ...`` execs this with the same arguments. uvicorn's access log is always off:
it would print request paths with query strings, and contact search puts phone numbers there.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import sys

import uvicorn

from sandbox.app import create_app
from sandbox.config import load_config
from sandbox.faults import QuietDroppedResponses


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sandbox",
        description=(
            "Local double of the customer-messaging workspace API (contract operations under "
            "/api/v1/accounts/{account_id}, inspection under /_sandbox/). Loopback use only."
        ),
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=3000, help="TCP port to bind (default 3000)")
    parser.add_argument(
        "--config",
        metavar="FILE",
        default=None,
        help=(
            "TOML file with seed ([[accounts]], [[tokens]], [[inboxes]], [[contacts]], [[recipient_rules]]) "
            "and settings ([behaviour], [webhooks], [faults.<operationId>]); missing parts come from the "
            "default seed shipped in the package. See docs/sandbox.md."
        ),
    )
    parser.add_argument(
        "--log-level",
        default="warning",
        choices=["critical", "error", "warning", "info", "debug"],
        help="log level of the sandbox and uvicorn (default warning)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = load_config(args.config)
    except (OSError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
        print(f"sandbox: cannot load config: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    fast = {
        "http": "httptools" if importlib.util.find_spec("httptools") else "h11",
        "loop": "uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
    }
    server_config = uvicorn.Config(
        create_app(config),
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=1,  # a request held by a fault must not delay shutdown
        **fast,
    )
    server = uvicorn.Server(server_config)
    logging.getLogger("uvicorn.error").addFilter(QuietDroppedResponses())
    server.run()
    return 0 if server.started else 1


if __name__ == "__main__":
    raise SystemExit(main())
