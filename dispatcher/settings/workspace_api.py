"""How to reach the workspace API: its address, the account, the token, and HTTP's budgets."""

from __future__ import annotations

from pydantic import Field, SecretStr, field_validator

from dispatcher.settings.checks import BaseUrl, Concern

SEND_LEASE_MARGIN_S = 5.0  # past the HTTP budget: the commit that records createMessage's answer


class WorkspaceApi(Concern):
    api_url: BaseUrl
    account_id: int = Field(gt=0)
    api_token: SecretStr

    # HTTP to the workspace API. Reads and writes get the same budget: the real service
    # gives up on its own side well before 30 s.
    http_connect_timeout_s: float = Field(default=5.0, gt=0, le=120)
    http_read_timeout_s: float = Field(default=15.0, gt=0, le=300)
    http_write_timeout_s: float = Field(default=15.0, gt=0, le=300)
    http_pool_timeout_s: float = Field(default=5.0, gt=0, le=120)
    http_max_connections: int = Field(default=20, gt=0, le=1000)

    @field_validator("api_token")
    @classmethod
    def _token_present(cls, value: SecretStr) -> SecretStr:
        if not value.get_secret_value().strip():
            raise ValueError("must not be empty")
        return value

    @property
    def http_budget_s(self) -> float:
        """The longest one API call can take: every timeout of its phases together."""
        return self.http_connect_timeout_s + self.http_write_timeout_s + self.http_read_timeout_s + self.http_pool_timeout_s

    @property
    def send_lease_s(self) -> float:
        """How long a createMessage call holds its attempt: the call's whole HTTP budget and a margin
        for recording its answer (45 s at the defaults). No other run looks for its message before
        the lease ends, so a worker killed mid-call delays that notification this long, no more."""
        return self.http_budget_s + SEND_LEASE_MARGIN_S
