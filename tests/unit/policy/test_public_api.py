"""The policy package's public face is exactly its __all__."""

from __future__ import annotations

import dispatcher.policy as policy


def test_all_is_exactly_the_public_names() -> None:
    # given the package; when listing its public, non-module names; then they equal __all__
    public = {name for name, value in vars(policy).items()
              if not name.startswith("_") and not isinstance(value, type(policy))}
    assert public == set(policy.__all__)
    assert len(policy.__all__) == len(set(policy.__all__))
