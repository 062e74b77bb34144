"""Outcome callbacks to the host: events the lifecycle wrote (:mod:`dispatcher.lifecycle.announce`),
signed per Standard Webhooks (:mod:`.signing`) and delivered at least once (:mod:`.deliver`)."""
