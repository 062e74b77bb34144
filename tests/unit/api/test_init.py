"""``dispatcher.api`` exports exactly its public face."""

from __future__ import annotations

import dispatcher.api as api


def test_all_is_exactly_the_public_face() -> None:
    public = {name for name in vars(api) if not name.startswith("_")}
    modules = {"client", "contacts", "errors", "paging", "records", "shared"}
    assert set(api.__all__) == public - modules
    assert sorted(api.__all__) == api.__all__
    assert {"WorkspaceClient", "ApiError", "NotSent", "OutcomeUnknown", "Message",
            "find_contact_exact", "iter_messages", "shared_client"} <= set(api.__all__)
