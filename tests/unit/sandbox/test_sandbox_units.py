"""Fast checks of the sandbox's pure parts: signing, config, channel rules, fault draws, layout."""

from __future__ import annotations

import ast
import random
from pathlib import Path

import pytest

from sandbox import channels, config, webhooks
from sandbox.bodies import ContactCreate, MessageCreate, WebhookCreate
from sandbox.faults import FaultTable

SANDBOX_DIR = Path(config.__file__).resolve().parent


# -- signing -------------------------------------------------------------------------------------
def test_signature_matches_an_external_reference_vector() -> None:
    # Computed with: printf '%s' '1700000000.{"event":"message_created","id":1}' |
    #   openssl dgst -sha256 -hmac 'whsec-test-secret'
    body = b'{"event":"message_created","id":1}'
    expected = "sha256=2f631138fe887eddd7cf5f6ccfa64108972b56d55a72a21b7de817b2b129d94c"
    assert webhooks.sign("whsec-test-secret", "1700000000", body) == expected


def test_signature_covers_the_exact_bytes() -> None:
    a = webhooks.sign("s", "1", b'{"a":1}')
    assert a != webhooks.sign("s", "1", b'{"a": 1}')
    assert a != webhooks.sign("s", "2", b'{"a":1}')


def test_payload_encoding_is_compact_utf8() -> None:
    assert webhooks.encode_payload({"content": "ó", "n": 1}, escape_html=False) == '{"content":"ó","n":1}'.encode()


def test_stock_encoding_escapes_html_characters_as_rails_does_and_keeps_the_json_equal() -> None:
    # given a payload with the characters Rails' JSON encoder escapes, and some non-ASCII
    payload = {"content": "<b>Tom & Jerry</b> ó \u2028", "n": 1}
    # when it is encoded the stock way
    body = webhooks.encode_payload(payload, escape_html=True)
    # then < > & and U+2028 are \u escapes, non-ASCII stays raw UTF-8, and the JSON is the same
    assert body == b'{"content":"\\u003cb\\u003eTom \\u0026 Jerry\\u003c/b\\u003e \xc3\xb3 \\u2028","n":1}'
    import json

    assert json.loads(body) == payload


# -- configuration -------------------------------------------------------------------------------
def test_default_seed_is_exactly_what_the_dispatcher_example_relies_on() -> None:
    cfg = config.load_config()
    assert [(a.id, a.name) for a in cfg.accounts] == [(1, "Demo Clinic"), (2, "Other Practice")]
    assert {t.token: t.accounts for t in cfg.tokens} == {
        "sandbox-token-account-1": [1],
        "sandbox-token-account-2": [2],
    }
    inboxes = {i.id: (i.account_id, i.name, i.channel_type, i.sends_per_minute) for i in cfg.inboxes}
    assert inboxes == {
        1: (1, "WhatsApp Reminders", "Channel::Whatsapp", None),
        2: (1, "SMS", "Channel::Sms", None),
        3: (1, "Email", "Channel::Email", None),
        4: (1, "Web Session", "Channel::WebSession", 10),
        5: (1, "Patient Portal API", "Channel::Api", None),
        6: (2, "Other API", "Channel::Api", None),
    }
    templates = {(t.name, t.language, t.category, t.body_params) for t in cfg.inboxes[0].templates}
    assert templates == {
        ("appointment_reminder", "en", "UTILITY", 2),
        ("appointment_reminder", "es", "UTILITY", 2),
        ("test_results_ready", "en", "UTILITY", 1),
    }
    rules = [(r.phone_prefix, r.inbox_ids, r.effect, r.external_error) for r in cfg.recipient_rules]
    assert rules[0] == ("+1555010", [1], "fail", "131026: Message undeliverable")
    assert rules[1][:3] == ("+1555020", [1, 2], "never_confirm")
    regressing = [(r.phone_prefix, r.effect, r.then_read) for r in cfg.recipient_rules if r.effect == "regress"]
    assert regressing == [("+1555070", "regress", True), ("+1555071", "regress", False)]
    assert cfg.behaviour.late_sent_after_s is None  # today's timing: half of read_after_s
    assert cfg.contacts == [] and cfg.faults == {}


def test_a_partial_file_keeps_the_default_seed_and_other_settings() -> None:
    cfg = config.parse_config_text("[behaviour]\ndelivered_after_s = 0.05\n[faults.createMessage]\nlatency_s = 1\n")
    assert cfg.behaviour.delivered_after_s == 0.05
    assert cfg.behaviour.read_after_s == 1.5
    assert len(cfg.inboxes) == 6
    assert cfg.faults["createMessage"].latency_s == 1


def test_a_file_with_accounts_replaces_the_whole_seed() -> None:
    cfg = config.parse_config_text(
        'accounts = [{id = 9, name = "N"}]\ntokens = [{token = "t", accounts = [9]}]\n'
        'inboxes = [{id = 1, account_id = 9, name = "A", channel_type = "Channel::Api"}]\n'
    )
    assert [i.id for i in cfg.inboxes] == [1]
    assert cfg.recipient_rules == []


@pytest.mark.parametrize(
    "text",
    [
        "[behaviour]\ntypo_key = 1\n",
        "[faults.sendEverything]\nlatency_s = 1\n",
        "[faults.createMessage]\nserver_error_share = 1.5\n",
        'accounts = [{id = 1, name = "A"}]\ntokens = [{token = "t", accounts = [2]}]\ninboxes = []\n',
        'accounts = [{id = 1, name = "A"}]\ntokens = [{token = "t", accounts = [1]}]\ninboxes = []\n'
        'recipient_rules = [{phone_prefix = "+1", effect = "never_confirm", then_read = false}]\n',
        "[behaviour]\nlate_sent_after_s = -0.1\n",
    ],
)
def test_invalid_configs_are_rejected(text: str) -> None:
    with pytest.raises(ValueError):
        config.parse_config_text(text)


# -- channel rules -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("params", "count"),
    [
        ({"body": {"1": "a", "2": "b"}, "header": {"media_url": "x"}}, 2),
        ({"1": "a", "2": "b"}, 2),
        ({"body": {"discount_percentage": "30"}, "buttons": []}, 1),
        ({}, 0),
    ],
)
def test_body_parameters_are_counted_in_both_shapes(params: dict, count: int) -> None:
    assert channels.count_body_params(params) == count


def test_template_errors() -> None:
    inbox = config.load_config().inboxes[0]
    ok = {"name": "appointment_reminder", "language": "es", "processed_params": {"1": "a", "2": "b"}}
    assert channels.template_error(inbox, ok) is None
    assert channels.template_error(inbox, {**ok, "language": "fr"}).startswith("132001")
    assert channels.template_error(inbox, {**ok, "name": "nope"}).startswith("132001")
    assert channels.template_error(inbox, {**ok, "processed_params": {"1": "a"}}).startswith("132000")


def test_sliding_window_forgets_after_a_minute() -> None:
    now = [100.0]
    window = channels.SlidingWindow(60.0, clock=lambda: now[0])
    window.add("k")
    window.add("k")
    now[0] = 130.0
    window.add("k")
    assert window.count("k") == 3
    now[0] = 160.5
    assert window.count("k") == 1
    assert window.count("other") == 0


# -- faults --------------------------------------------------------------------------------------
def test_fault_draws_follow_the_shares_and_replay() -> None:
    fault = config.Fault(rate_limit_share=0.25, server_error_share=0.25)
    table = FaultTable({}, seed=7)
    draws = [table.draw(fault) for _ in range(4000)]
    table.reset()
    assert draws == [table.draw(fault) for _ in range(4000)]
    assert 0.2 < draws.count("rate_limit") / 4000 < 0.3
    assert 0.2 < draws.count("server_error") / 4000 < 0.3
    assert "timeout" not in draws


def test_fault_table_rejects_unknown_operations() -> None:
    with pytest.raises(ValueError, match="unknown operationId"):
        FaultTable({}, seed=1).replace({"deleteEverything": {}})


# -- request bodies ------------------------------------------------------------------------------
def test_bodies_are_strict_but_open() -> None:
    assert MessageCreate.model_validate({"content": "x", "echo_id": 1}, strict=True).content == "x"
    with pytest.raises(ValueError):
        ContactCreate.model_validate({"inbox_id": True}, strict=True)
    with pytest.raises(ValueError):
        ContactCreate.model_validate({"inbox_id": 1, "name": None}, strict=True)
    with pytest.raises(ValueError):
        WebhookCreate.model_validate({"webhook": {"url": "ftp://x", "subscriptions": ["message_created"]}}, strict=True)


def test_the_seeded_store_replays_random_ids() -> None:
    from sandbox.state import Store

    cfg = config.load_config()
    a, b = Store(cfg, rng=random.Random(1)), Store(cfg, rng=random.Random(1))
    assert [a.new_uuid() for _ in range(3)] == [b.new_uuid() for _ in range(3)]
    assert a.new_secret() == b.new_secret()


# -- layout --------------------------------------------------------------------------------------
def test_sandbox_imports_nothing_from_dispatcher_or_workers() -> None:
    """The sandbox is the other side of the contract: sharing code would hide shared mistakes."""
    offenders = []
    for path in SANDBOX_DIR.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in {"dispatcher", "workers"}]
    assert offenders == []
    assert len(list(SANDBOX_DIR.glob("*.py"))) >= 10  # the walk really saw the package


def test_modules_stay_small() -> None:
    sizes = {p.name: len(p.read_text().splitlines()) for p in SANDBOX_DIR.glob("*.py")}
    assert max(sizes.values()) <= 400, sizes


def test_default_seed_ships_as_package_data() -> None:
    from importlib import resources

    assert "Demo Clinic" in resources.files("sandbox").joinpath("seed.default.toml").read_text()


# -- profiles ------------------------------------------------------------------------------------
def test_the_default_profile_is_stock_with_its_settings() -> None:
    cfg = config.load_config()
    assert cfg.profile == "stock"
    assert (cfg.webhooks.header_prefix, cfg.webhooks.include_status, cfg.webhooks.max_retries) == ("Chatwoot", False, 0)
    assert cfg.behaviour.contact_search_per_minute == 100


def test_a_file_chooses_the_profile_and_the_command_line_wins() -> None:
    contract = config.parse_config_text('profile = "contract"\n')
    assert (contract.profile, contract.webhooks.header_prefix, contract.webhooks.max_retries) == ("contract", "Service", 2)
    assert contract.behaviour.contact_search_per_minute == 0
    assert config.parse_config_text('profile = "contract"\n', profile="stock").webhooks.header_prefix == "Chatwoot"
    assert config.parse_config_text("", profile="contract").webhooks.include_status is True


def test_a_file_overrides_one_profile_setting_and_keeps_the_others() -> None:
    cfg = config.parse_config_text('profile = "contract"\n[webhooks]\nmax_retries = 0\n')
    assert (cfg.webhooks.max_retries, cfg.webhooks.header_prefix, cfg.webhooks.include_status) == (0, "Service", True)


def test_a_config_built_in_code_gets_its_profile_s_settings_too() -> None:
    raw = {"profile": "contract", "accounts": [{"id": 1, "name": "A"}], "tokens": [], "inboxes": []}
    cfg = config.SandboxConfig.model_validate(raw)
    assert (cfg.webhooks.header_prefix, cfg.webhooks.max_retries, cfg.behaviour.contact_search_per_minute) == ("Service", 2, 0)


@pytest.mark.parametrize("name", ["", "Stock", "chatwoot"])
def test_an_unknown_profile_is_refused_naming_the_key(name: str) -> None:
    with pytest.raises(ValueError, match="profile"):
        config.parse_config_text(f'profile = "{name}"\n')
