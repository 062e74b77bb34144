"""``python -m sandbox [--host H] [--port P] [--config FILE] [--profile stock|contract]
[--state FILE | --in-memory] [--fresh] [--log-level LEVEL]``.

``dispatcher sandbox ...`` execs this with the same arguments. uvicorn's access log is always off:
it would print request paths with query strings, and contact search puts phone numbers there.
At start it prints one short block saying where it listens and how to use it (banner below).
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import sys
from collections.abc import Callable
from pathlib import Path

import uvicorn

from sandbox.app import create_app
from sandbox.config import SandboxConfig, load_config
from sandbox.faults import QuietDroppedResponses
from sandbox.journal import Journal, StateFileError
from sandbox.profiles import PROFILE_NAMES
from sandbox.runtime import Sandbox

DEFAULT_STATE_FILE = Path("var") / "sandbox-state.jsonl"


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
            "and settings (profile, [behaviour], [webhooks], [faults.<operationId>]); missing parts come from "
            "the default seed shipped in the package. See docs/sandbox.md."
        ),
    )
    parser.add_argument(
        "--profile",
        choices=PROFILE_NAMES,
        default=None,
        help="stock (default): behave like a stock workspace; contract: the contract's nominal shapes. "
        "Wins over the config file's `profile`.",
    )
    state = parser.add_mutually_exclusive_group()
    state.add_argument(
        "--state",
        metavar="FILE",
        type=Path,
        default=DEFAULT_STATE_FILE,
        help=f"keep contacts, conversations, messages and webhooks in FILE across restarts (default {DEFAULT_STATE_FILE})",
    )
    state.add_argument("--in-memory", action="store_true", help="keep nothing on disk: every start is empty")
    parser.add_argument("--fresh", action="store_true", help="start empty: forget what the state file held")
    parser.add_argument(
        "--log-level",
        default="warning",
        choices=["critical", "error", "warning", "info", "debug"],
        help="log level of the sandbox and uvicorn (default warning)",
    )
    return parser


def banner(sandbox: Sandbox, *, host: str, port: int, state: Path | None) -> str:
    """Where it listens and how to reach it: URL, accounts and tokens, inboxes, profile, state file.

    ``host`` and ``port`` are the bound socket's, so ``--port 0`` shows the port the system chose.
    """
    config = sandbox.config
    everywhere = host in ("0.0.0.0", "::")  # the wildcard: say so, and how to reach it from here
    reachable = "127.0.0.1" if everywhere else host
    url = f"http://{f'[{reachable}]' if ':' in reachable else reachable}:{port}"
    where = f"every address, port {port} ({url} from this machine)" if everywhere else url
    lines = [f"sandbox listening on {where}  (profile: {config.profile})"]
    for account in config.accounts:
        tokens = [t.token for t in config.tokens if account.id in t.accounts]
        lines.append(f"  account {account.id} ({account.name}): token {', '.join(tokens) or '-'}")
        for inbox in sandbox.store.inboxes_of(account.id):
            lines.append(f"    inbox {inbox.id}: {inbox.channel_type} \"{inbox.name}\"")
    if state is None:
        lines.append("  state: in memory only (--in-memory): a restart starts empty")
    else:
        kept = f"{sandbox.restored_records} records restored" if sandbox.restored_records else "started empty"
        lines.append(f"  state: {state} ({kept})")
    first = config.accounts[0]
    token = next((t.token for t in config.tokens if first.id in t.accounts), "TOKEN")
    lines += [
        "  register a webhook (receiver on port 8080):",
        f"    DISPATCHER_API_URL={url} DISPATCHER_ACCOUNT_ID={first.id} DISPATCHER_API_TOKEN={token} \\",
        "      dispatcher webhooks register --url http://127.0.0.1:8080/webhooks/messaging",
    ]
    return "\n".join(lines)


class AnnouncingServer(uvicorn.Server):
    """Prints the banner once the socket is bound, from the bound address, so what it says is true."""

    def __init__(self, config: uvicorn.Config, text: Callable[[str, int], str]) -> None:
        super().__init__(config)
        self.text = text

    async def startup(self, sockets: list | None = None) -> None:  # type: ignore[type-arg]
        await super().startup(sockets=sockets)
        if self.started and self.servers and self.servers[0].sockets:
            host, port = self.servers[0].sockets[0].getsockname()[:2]
            print(self.text(host, port), flush=True)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config: SandboxConfig = load_config(args.config, profile=args.profile)
    except (OSError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
        print(f"sandbox: cannot load config: {exc}", file=sys.stderr)
        return 2
    state = None if args.in_memory else args.state
    try:
        sandbox = Sandbox(config, journal=Journal(state), fresh=args.fresh)
    except StateFileError as exc:
        print(f"sandbox: {state}: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    http = "httptools" if importlib.util.find_spec("httptools") else "h11"
    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    server_config = uvicorn.Config(
        create_app(sandbox=sandbox),
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=1,  # a request held by a fault must not delay shutdown
        http=http,
        loop=loop,
    )
    server = AnnouncingServer(server_config, lambda host, port: banner(sandbox, host=host, port=port, state=state))
    logging.getLogger("uvicorn.error").addFilter(QuietDroppedResponses())
    server.run()  # the app's lifespan compacts and releases the state file at a clean stop
    return 0 if server.started else 1


if __name__ == "__main__":
    raise SystemExit(main())
