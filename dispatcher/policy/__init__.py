"""Send-path policy as plain values and pure functions; tasks only apply it.

``backoff`` (the retry arithmetic), ``retry`` (error → Decision), ``ratelimit`` (limits shared by
every worker, and the global pause after a 429), ``channels`` (template or free text),
``fallback`` (which platform failures fall back to another route).
"""

from dispatcher.policy.backoff import backoff_s
from dispatcher.policy.channels import MessageKind, TemplateRef, choose_message_kind, template_params
from dispatcher.policy.fallback import FallbackRules, FallbackVerdict, classify_failure, parse_error_code
from dispatcher.policy.ratelimit import WINDOW_S, Limit, Limiter, LocalLimiter, RedisLimiter, acquire_all, route_bucket
from dispatcher.policy.retry import Decision, DecisionKind, RetryPlan, classify_error, decide, is_final

__all__ = [
    "WINDOW_S",
    "Decision",
    "DecisionKind",
    "FallbackRules",
    "FallbackVerdict",
    "Limit",
    "Limiter",
    "LocalLimiter",
    "MessageKind",
    "RedisLimiter",
    "RetryPlan",
    "TemplateRef",
    "acquire_all",
    "backoff_s",
    "choose_message_kind",
    "classify_error",
    "classify_failure",
    "decide",
    "is_final",
    "parse_error_code",
    "route_bucket",
    "template_params",
]
