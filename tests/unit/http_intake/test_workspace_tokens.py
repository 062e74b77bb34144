"""Several workspaces behind one intake: a token reaches its own workspace's notifications only.
It can neither create one in another workspace nor read, cancel, move or retry one there; its
opt-outs are its own account's."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dispatcher.enqueue import ListEnqueuer
from dispatcher.intake.http import BATCHES_PATH, create_intake_app
from dispatcher.service import Dispatcher
from tests.support.dispatcher_setup import example_settings
from tests.unit.http_intake.conftest import AUTH, PATH, TOKEN, TestClient, valid_request

NORTH_TOKEN = "north-intake-token-51c9a0e2"
NORTH = {"Authorization": f"Bearer {NORTH_TOKEN}"}


@pytest.fixture()
def two(store_url: str, clean_environment: pytest.MonkeyPatch) -> Iterator[tuple[TestClient, Dispatcher]]:
    settings = example_settings(api_url="http://127.0.0.1:9", database_url=store_url, workspaces={
        "north": {"api_url": "http://127.0.0.1:9", "account_id": 7, "api_token": "north-api-token-0123456789",
                  "intake_token": NORTH_TOKEN}})
    dispatcher = Dispatcher(settings, enqueuer=ListEnqueuer())
    with TestClient(create_intake_app(dispatcher, token=TOKEN)) as client:
        yield client, dispatcher


def test_a_token_creates_in_its_own_workspace_only(two: tuple[TestClient, Dispatcher]) -> None:
    client, dispatcher = two
    assert client.post(PATH, json=valid_request("north-1"), headers=NORTH).status_code == 202
    assert dispatcher.status("north-1").route == "reminders"
    with dispatcher.sessions() as session:
        from dispatcher.store import queries as store

        row = store.find_notification_by_event(session, "north-1")
        assert row is not None and row.workspace == "north"
    foreign = client.post(PATH, json=valid_request("north-2", workspace="default"), headers=NORTH)
    assert (foreign.status_code, foreign.json()["field"]) == (403, "workspace")
    also_foreign = client.post(PATH, json=valid_request("default-2", workspace="north"), headers=AUTH)
    assert (also_foreign.status_code, also_foreign.json()["field"]) == (403, "workspace")
    unknown = client.post(PATH, json=valid_request("x-1", workspace="south"), headers=NORTH)
    assert unknown.status_code == 403
    import json

    smuggled = client.post(PATH, json=json.dumps(valid_request("north-9")), headers=NORTH)  # a JSON string of a request
    assert (smuggled.status_code, smuggled.json()["field"]) == (422, "body")
    batch = client.post(BATCHES_PATH, json={"notifications": [json.dumps(valid_request("north-10"))]}, headers=NORTH)
    assert batch.json()["results"][0]["outcome"] == "refused"
    with pytest.raises(Exception, match="workspace"):  # in Python, a workspace nobody configured is named
        dispatcher.notify(valid_request("x-2", workspace="south"))


def test_a_token_neither_reads_nor_changes_another_workspace_s_notification(two: tuple[TestClient, Dispatcher]) -> None:
    client, _ = two
    assert client.post(PATH, json=valid_request("default-1"), headers=AUTH).status_code == 202
    assert client.post(PATH, json=valid_request("north-3", send_at="2099-01-01T09:00:00+00:00"),
                       headers=NORTH).status_code == 202
    for headers, event_id in ((NORTH, "default-1"), (AUTH, "north-3")):
        url = f"{PATH}/{event_id}"
        assert client.get(url, headers=headers).status_code == 404
        assert client.delete(url, headers=headers).status_code == 404
        assert client.patch(url, json={"send_at": "2099-02-01T09:00:00+00:00"}, headers=headers).status_code == 404
        assert client.post(url, headers=headers).status_code == 404
    assert client.get(f"{PATH}/default-1", headers=AUTH).json()["state"] == "queued"
    assert client.get(f"{PATH}/north-3", headers=NORTH).json()["state"] == "scheduled"
    assert client.delete(f"{PATH}/north-3", headers=NORTH).json()["state"] == "cancelled"


def test_a_batch_item_naming_another_workspace_is_refused_alone(two: tuple[TestClient, Dispatcher]) -> None:
    client, _ = two
    answer = client.post(BATCHES_PATH, headers=NORTH, json={"notifications": [
        valid_request("north-b1"), valid_request("north-b2", workspace="default")]})
    assert [(r["outcome"], r.get("field")) for r in answer.json()["results"]] == [("accepted", None),
                                                                                   ("refused", "workspace")]


def test_opt_outs_are_each_workspace_s_own(two: tuple[TestClient, Dispatcher]) -> None:
    client, _ = two
    recipient = {"recipient": {"phone_number": "+15550390001"}}
    assert client.post("/v1/recipients/suppress", json=recipient, headers=NORTH).json() == {"added": 1}
    assert client.post("/v1/recipients/check", json={**recipient, "channel": "sms"}, headers=NORTH).json() == {
        "suppressed": True}
    assert client.post("/v1/recipients/check", json={**recipient, "channel": "sms"}, headers=AUTH).json() == {
        "suppressed": False}


@pytest.mark.parametrize("workspace", [
    {"api_url": "http://127.0.0.1:9", "account_id": 1, "api_token": "t" * 20},
    {"api_url": "http://127.0.0.1:9/", "account_id": 1, "api_token": "t" * 20},
    {"api_url": "http://LOCALHOST:80", "account_id": 1, "api_token": "t" * 20, "top": "http://localhost"},
])
def test_two_workspaces_cannot_be_one_account(workspace: dict[str, object], clean_environment: pytest.MonkeyPatch) -> None:
    from dispatcher.errors import ConfigurationError

    top = str(workspace.pop("top", "http://127.0.0.1:9"))
    with pytest.raises(ConfigurationError) as refused:
        example_settings(api_url=top, workspaces={"north": workspace})
    assert "workspaces.north.account_id" in str(refused.value) and "t" * 20 not in str(refused.value)


def test_an_account_of_another_instance_is_keyed_apart(clean_environment: pytest.MonkeyPatch) -> None:
    settings = example_settings(api_url="http://127.0.0.1:9", workspaces={
        "north": {"api_url": "http://127.0.0.1:9", "account_id": 2, "api_token": "t" * 20},
        "south": {"api_url": "http://elsewhere:3000", "account_id": 1, "api_token": "u" * 20}})
    accounts = [settings.for_workspace(name).account for name in ("default", "north", "south")]
    # the top-level instance's accounts by their IDs; another instance's account 1 by its name too
    assert [(account.instance, account.id) for account in accounts] == [("default", 1), ("default", 2), ("south", 1)]


def test_a_workspace_api_url_is_checked_like_the_top_level_one(clean_environment: pytest.MonkeyPatch) -> None:
    from dispatcher.errors import ConfigurationError

    with pytest.raises(ConfigurationError) as refused:
        example_settings(api_url="http://127.0.0.1:9", workspaces={
            "north": {"api_url": "http://elsewhere:3000/api/v1", "account_id": 2, "api_token": "t" * 20}})
    assert "workspaces.north.api_url" in str(refused.value)


def test_the_example_in_the_docs_works_as_written(clean_environment: pytest.MonkeyPatch) -> None:
    import tomllib

    from tests.conftest import REPO_ROOT

    text = (REPO_ROOT / "docs" / "workspaces.md").read_text()
    settings = example_settings(api_url="http://127.0.0.1:3000", **tomllib.loads(text.split("```toml\n")[1].split("```")[0]))
    north = settings.for_workspace("north")
    assert (north.account_id, list(north.routes), north.workspace_name) == (2, ["portal"], "north")
    assert list(settings.intake_tokens()) == ["north"]
    south = settings.for_workspace("south")  # another instance: its account 1 is its own
    assert (south.api_url, south.account.instance, south.account.id) == ("http://127.0.0.1:3001", "south", 1)


def test_each_intake_token_is_one_workspace_s(clean_environment: pytest.MonkeyPatch) -> None:
    from dispatcher.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="intake_token"):
        example_settings(api_url="http://127.0.0.1:9", intake_token=NORTH_TOKEN, workspaces={"north": {
            "api_url": "http://127.0.0.1:9", "account_id": 7, "api_token": "t" * 20, "intake_token": NORTH_TOKEN}})


def test_the_outbox_and_the_keyed_hashes_follow_the_workspace(two: tuple[TestClient, Dispatcher]) -> None:
    from dispatcher.intake import outbox
    from dispatcher.store import queries as store

    _, dispatcher = two
    with dispatcher.sessions.begin() as session:
        outbox.add(session, valid_request("north-outbox", workspace="north"), settings=dispatcher.settings)
    with dispatcher.sessions() as session:
        row = store.find_notification_by_event(session, "north-outbox")
        assert row is not None and row.workspace == "north"
    # a purged event stays spent whichever workspace hands it over again: one key for every hash at rest
    assert dispatcher.settings.for_workspace("north").hashing_key == dispatcher.settings.hashing_key


def test_an_opt_out_for_a_workspace_that_is_not_configured_is_refused(two: tuple[TestClient, Dispatcher]) -> None:
    from dispatcher.errors import InvalidEvent

    _, dispatcher = two
    with pytest.raises(InvalidEvent) as refused:
        dispatcher.recipients_for("nrth").suppress({"phone_number": "+15550390002"})
    assert refused.value.field == "workspace"
    assert dispatcher.recipients_for("north").settings.workspace_name == "north"


def test_a_workspace_token_alone_serves_the_intake_for_that_workspace(
        store_url: str, clean_environment: pytest.MonkeyPatch) -> None:
    from dispatcher.errors import ConfigurationError

    settings = example_settings(api_url="http://127.0.0.1:9", database_url=store_url, workspaces={
        "north": {"api_url": "http://127.0.0.1:9", "account_id": 7, "api_token": "north-api-token-0123456789",
                  "intake_token": NORTH_TOKEN}})
    dispatcher = Dispatcher(settings, enqueuer=ListEnqueuer())
    with TestClient(create_intake_app(dispatcher, token=None)) as client:
        assert client.post(PATH, json=valid_request("north-only-1"), headers=NORTH).status_code == 202
        assert client.post(PATH, json=valid_request("north-only-2"), headers=AUTH).status_code == 401
    with pytest.raises(ConfigurationError, match="intake_token"):  # no token at all: nobody could call it
        create_intake_app(Dispatcher(example_settings(api_url="http://127.0.0.1:9", database_url=store_url),
                                     enqueuer=ListEnqueuer()), token=None)


def test_a_workspace_s_callbacks_are_signed_with_its_own_secrets_or_the_top_level_ones(
        clean_environment: pytest.MonkeyPatch) -> None:
    from dispatcher.errors import ConfigurationError

    own = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    north = {"api_url": "http://127.0.0.1:9", "account_id": 2, "api_token": "t" * 20,
             "callback_url": "http://127.0.0.1:8000/north"}
    settings = example_settings(api_url="http://127.0.0.1:9", workspaces={"north": {**north, "callback_secrets": [own]}})
    assert settings.callbacks_on and not settings.callback_secrets
    assert [secret.get_secret_value() for secret in settings.for_workspace("north").callback_secrets] == [own]
    with pytest.raises(ConfigurationError, match=r"workspaces\.north\.callback_secrets"):
        example_settings(api_url="http://127.0.0.1:9", workspaces={"north": north})
    with pytest.raises(ConfigurationError, match=r"workspaces\.north\.callback_secrets") as refused:
        example_settings(api_url="http://127.0.0.1:9", workspaces={"north": {**north, "callback_secrets": ["not-whsec-42"]}})
    assert "not-whsec-42" not in str(refused.value)
