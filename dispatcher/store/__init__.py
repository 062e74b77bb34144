"""The store: tables (``models``), engines and sessions (``db``), schema migrations, and the reads (``queries``).

State columns are written only by :mod:`dispatcher.lifecycle.moves`; ``queries`` reads and records facts.
"""
