"""The hand-written baseline: what a naive integrator writes from the contract, with plain httpx.

It imports nothing from the dispatcher on purpose. For every notification it walks the
contract's "Normal send path" from the top (the inbox list is read once at start-up):

    searchContacts -> createContact (if absent) -> listContactableInboxes -> createConversation -> createMessage

which is 5 calls for a new contact and 4 for a known one. It keeps nothing between
notifications (no contact, source_id or conversation cache), and its error handling is a
retry-on-error loop: any exception or non-2xx answer anywhere starts the whole sequence again,
after a short sleep, up to ``max_tries`` times; then the notification is given up.

    .venv/bin/python scripts/bench/naive_client.py --api-url http://127.0.0.1:3000 --events 100 --contacts 20
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

INBOX_NAME = "WhatsApp Reminders"
TEMPLATE = {"name": "appointment_reminder", "category": "UTILITY", "language": "en"}


class NaiveIntegrator:
    def __init__(self, api_url: str, *, account_id: int = 1, token: str = "sandbox-token-account-1",
                 inbox_name: str = INBOX_NAME, max_tries: int = 3, retry_sleep_s: float = 0.2,
                 timeout_s: float = 5.0) -> None:
        self.base = f"{api_url.rstrip('/')}/api/v1/accounts/{account_id}"
        self.headers = {"api_access_token": token}
        self.max_tries = max_tries
        self.retry_sleep_s = retry_sleep_s
        self.timeout_s = timeout_s
        self._local = threading.local()
        self.inbox_id = self._find_inbox(inbox_name)

    def _client(self) -> httpx.Client:
        client = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = httpx.Client(headers=self.headers, timeout=self.timeout_s, trust_env=False)
        return client

    def _find_inbox(self, name: str) -> int:
        for _ in range(20):  # start-up: keep asking until the inbox list answers
            try:
                response = self._client().get(f"{self.base}/inboxes")
                response.raise_for_status()
                return next(inbox["id"] for inbox in response.json()["payload"] if inbox["name"] == name)
            except httpx.HTTPError:
                time.sleep(self.retry_sleep_s)
        raise SystemExit("the inbox list never answered")

    def send(self, event_id: str, *, identifier: str, phone: str, name: str, content: str,
             params: dict[str, str]) -> tuple[str, int]:
        """Send one notification: ("sent" | "gave_up", tries used)."""
        for attempt in range(1, self.max_tries + 1):
            try:
                self._steps(identifier=identifier, phone=phone, name=name, content=content, params=params)
                return "sent", attempt
            except (httpx.HTTPError, KeyError, ValueError, StopIteration):
                time.sleep(self.retry_sleep_s)
        return "gave_up", self.max_tries

    def _steps(self, *, identifier: str, phone: str, name: str, content: str, params: dict[str, str]) -> None:
        client = self._client()
        # 1. search the contact by its stable identifier (exact match among the results)
        found = client.get(f"{self.base}/contacts/search", params={"q": identifier})
        found.raise_for_status()
        contact_id = next((c["id"] for c in found.json()["payload"] if c.get("identifier") == identifier), None)
        # 2. create it when absent
        if contact_id is None:
            created = client.post(f"{self.base}/contacts", json={"inbox_id": self.inbox_id, "name": name,
                                                                 "phone_number": phone, "identifier": identifier})
            created.raise_for_status()
            contact_id = created.json()["payload"]["contact"]["id"]
        # 3. its source_id for the inbox
        inboxes = client.get(f"{self.base}/contacts/{contact_id}/contactable_inboxes")
        inboxes.raise_for_status()
        source_id = next(e["source_id"] for e in inboxes.json()["payload"] if e["inbox"]["id"] == self.inbox_id)
        # 4. a conversation
        conversation = client.post(f"{self.base}/conversations",
                                   json={"source_id": source_id, "inbox_id": self.inbox_id, "contact_id": contact_id})
        conversation.raise_for_status()
        # 5. the message (an approved template: the platform inbox needs one outside the window)
        message = client.post(f"{self.base}/conversations/{conversation.json()['id']}/messages", json={
            "content": content, "message_type": "outgoing", "private": False,
            "template_params": {**TEMPLATE, "processed_params": {"body": params}},
        })
        message.raise_for_status()


def run(api_url: str, events: list[tuple[str, int]], *, threads: int = 4, max_tries: int = 3,
        retry_sleep_s: float = 0.2, phone_prefix: str = "+1555034", contact_prefix: str = "naive-patient") -> dict[str, Any]:
    """Send ``events`` ((event_id, contact number) pairs) from ``threads`` threads; count the outcomes."""
    integrator = NaiveIntegrator(api_url, max_tries=max_tries, retry_sleep_s=retry_sleep_s)
    outcomes: Counter[str] = Counter()
    tries: Counter[int] = Counter()
    lock = threading.Lock()

    def one(item: tuple[str, int]) -> None:
        event_id, contact = item
        outcome, used = integrator.send(
            event_id, identifier=f"{contact_prefix}-{contact}", phone=f"{phone_prefix}{contact:04d}", name="Bench Patient",
            content=f"Reminder {event_id}: your appointment is tomorrow at 09:00",
            params={"1": "Bench Patient", "2": "tomorrow 09:00"},
        )
        with lock:
            outcomes[outcome] += 1
            tries[used] += 1

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(one, events))
    return {"outcomes": dict(outcomes), "tries": {str(k): v for k, v in sorted(tries.items())},
            "seconds": round(time.perf_counter() - started, 2), "threads": threads, "max_tries": max_tries,
            "retry_sleep_s": retry_sleep_s}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--api-url", required=True, help="the workspace (sandbox) base URL, without /api/v1")
    parser.add_argument("--events", type=int, default=100)
    parser.add_argument("--contacts", type=int, default=20)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--max-tries", type=int, default=3)
    parser.add_argument("--retry-sleep", type=float, default=0.2)
    args = parser.parse_args()
    events = [(f"naive-{n}", n % args.contacts) for n in range(args.events)]
    json.dump(run(args.api_url, events, threads=args.threads, max_tries=args.max_tries, retry_sleep_s=args.retry_sleep),
              sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
