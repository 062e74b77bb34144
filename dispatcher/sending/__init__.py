"""Sending: one notification through the contract's steps, from the claim to the recorded answer.

``send`` reads top to bottom as the steps; ``resolve`` answers steps 2-5 (contact, source_id,
conversation) from the store when it can; ``recover`` finds a message that an ambiguous create may have sent.
"""
