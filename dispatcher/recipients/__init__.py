"""Recipients decide: opt-outs (suppressions), consent, and the replies and provider codes that
record them. docs/opt-outs.md explains scopes, categories, keywords and the host controls.

A recipient is never stored as its phone number, e-mail address or identifier: only keyed hashes
of them (:mod:`dispatcher.recipients.keys`). The send path asks :func:`~dispatcher.store.suppressions.blocking_reason`
in the transaction that claims the attempt, so an opt-out committed before the claim stops the send.
"""
